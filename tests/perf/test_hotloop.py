"""perf/hotloop.py: the in-process hot-path benchmark checks every reply, and the request path
it measures keeps a connection's queue name as parsed (no bytes -> str -> bytes -> str)."""
from __future__ import annotations

from lanner.perf import hotloop
from lanner.server.local import LocalFront


def test_hotloop_runs_and_checks_every_reply():
    assert hotloop.run(200, 2, 64, 2) > 0
    assert hotloop.run(256, 2, 1024, 32) > 0


def test_hotloop_main_prints_cpu_per_request(capsys):
    assert hotloop.main(["-n", "100", "-c", "1", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "CPU µs/request" in out and "compiled:" in out


def test_inline_requests_carry_the_parsed_queue_name(tmp_path, monkeypatch):
    """A worker serving its own client runs the request with the name the parser made: the
    front no longer encodes it for a ring it does not use, nor the worker decodes it again
    (the fused path for set/get, and `send` for the rest)."""
    seen = []

    class SeenFront(LocalFront):
        """Records the names `send` is given (LocalFront is a C type in the compiled build: its
        class cannot be patched)."""
        __slots__ = ()

        def send(self, worker, conn_id, req, op, flags, queue, *rest):
            seen.append(queue)
            return LocalFront.send(self, worker, conn_id, req, op, flags, queue, *rest)
    rig = hotloop.Rig(str(tmp_path), 1, front_class=SeenFront)
    try:
        worker = rig.worker

        def recording(real):
            """The worker's fused set or get (InlineOps' bound method, a slot of the worker),
            noting the queue name it is called with."""
            def call(src, conn, req, queue, *rest):
                seen.append(queue)
                return real(src, conn, req, queue, *rest)
            return call
        monkeypatch.setattr(worker, "inline_set", recording(worker.inline_set))
        monkeypatch.setattr(worker, "inline_get", recording(worker.inline_get))
        c = rig.conns[0]
        c.data_received(b"set jobs 0 0 2\r\nhi\r\nget jobs\r\nget jobs/peek\r\n")
        rig.turn()
        assert b"".join(c.transport.written) == b"STORED\r\nVALUE jobs 0 2\r\nhi\r\nEND\r\nEND\r\n"
        assert seen == ["jobs", "jobs", "jobs"]
        assert all(type(q) is str for q in seen)
    finally:
        rig.close()
