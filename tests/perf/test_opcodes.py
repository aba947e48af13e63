"""perf/opcodes.py: the per-function bytecode profile of the hot loop's rig counts what the
request path runs, per request, and its replies are still checked."""
from __future__ import annotations

from lanner.perf import hotloop, opcodes


def test_profile_counts_the_request_path_per_request():
    prof = opcodes.profile(200, 2, 64, 2, warmup_turns=5)
    assert prof.requests == 200
    ops, calls = prof.per_request()
    assert 30 < ops < 5000 and 1 < calls < 100     # (the chain compiled: ~95 bytecodes)
    names = {name: (b, c) for b, c, name in prof.rows(top=100)}
    # every request is parsed by pump and answered by fast_reply, one call each per request:
    # Python frames when conn.py is, none when it is compiled (only Python frames count)
    if "lanner.fronts.conn" in hotloop.compiled_modules():
        assert not any(name.startswith("engine/fronts/conn.py:") for name in names)
    else:
        assert names["engine/fronts/conn.py:Conn.pump"][1] == 1.0
        assert names["engine/fronts/conn.py:Conn.fast_reply"][1] == 1.0
    # half the requests are sets, half gets: the handlers' frames, none when memcache.py is
    # compiled, then the worker's calls they make (while server/inline.py is interpreted)
    compiled = hotloop.compiled_modules()
    if "lanner.fronts.memcache" in compiled:
        assert not any(name.startswith("engine/fronts/memcache.py:") for name in names)
        if "lanner.server.inline" not in compiled:
            assert names["engine/server/inline.py:InlineOps.inline_set"][1] == 0.5
            assert names["engine/server/inline.py:InlineOps.inline_get"][1] == 0.5
    else:
        assert names["engine/fronts/memcache.py:MemcacheConn.store"][1] == 0.5
        assert names["engine/fronts/memcache.py:MemcacheConn.on_get"][1] == 0.5
    rows = prof.rows(top=100)
    assert rows == sorted(rows, key=lambda r: -r[0])


def test_trace_counts_bytecodes_and_calls_of_python_frames():
    def inner(x):
        return x + 1

    def outer():
        return [inner(i) for i in range(10)]
    bytecodes, calls = opcodes.trace(outer)
    inner_key = next(k for k in calls if k[1].endswith("inner"))
    assert calls[inner_key] == 10
    assert bytecodes[inner_key] >= 30          # a few bytecodes per call
    assert all(not k[1].endswith("trace") for k in calls)     # the tracer does not count itself


def test_hotloop_opcodes_option_prints_the_table(capsys):
    assert hotloop.main(["--opcodes", "-n", "100", "-c", "1", "-r", "1"]) == 0
    out = capsys.readouterr().out
    assert "bytecodes" in out and "Python calls per request" in out
    compiled = hotloop.compiled_modules()
    if "lanner.fronts.memcache" not in compiled:
        assert "MemcacheConn.store" in out
    if "lanner.server.inline" not in compiled:
        assert "InlineOps.inline_set" in out
