"""The fused path's gate (fronts/inline.py FusedQueues, ServerStatus.clear) against the general
path: the same random commands on two in-process workers, one whose front may fuse and one
whose front never does, give the same replies, the same journal bytes and the same stats.
Aliases, a whitelisted queue, a bad name, full queues, noreply, expiries and status changes
are among the commands, so every reason the gate says "no" is crossed both ways; so are a
fanout child and open reads, which the worker's fused set and get (Worker.inline_set /
inline_get) hand to the collection's add and to Waiting.plain_get."""
from __future__ import annotations

import os
import random

import pytest

from lanner import clock as clock_mod
from lanner.config import Config, QueueConfig, ServerConfig
from lanner.fronts.inline import FusedQueues
from lanner.fronts.memcache import MemcacheConn
from lanner.perf.hotloop import Rig
from lanner.server import inline as inline_mod
from tests.fronts.test_inline import Transport

NOW = 1_790_000_000_000


class NeverFused(FusedQueues):
    """The general path for every queue: what the gate must be equivalent to."""

    def __missing__(self, queue: str) -> bool:
        return False


def make(folder: str) -> Rig:
    cfg = Config(server=ServerConfig(queue_path=os.path.join(folder, "q"),
                                     status_file=os.path.join(folder, "status")),
                 default=QueueConfig(max_items=4),
                 queue_overrides={"wl": {"white_list_client_id_for_dequeue": "x"},
                                  "keep": {"max_age": 50_000}},
                 aliases={"al": ("a", "keep")})
    os.makedirs(cfg.server.queue_path, exist_ok=True)
    return Rig(folder, 2, config=cfg, transport=Transport)


def command(rnd: random.Random) -> bytes:
    q = rnd.choice(["a", "a", "a", "a", "b", "b", "keep", "al", "wl", "bad name"])
    kind = rnd.random()
    if kind < 0.45:
        exp = rnd.choice([0, 0, 0, 5, 100, NOW // 1000 + 10, NOW // 1000 - 10])
        body = b"v%d" % rnd.randrange(1000)
        noreply = b" noreply" if rnd.random() < 0.1 else b""
        return b"set %s 0 %d %d%s\r\n%s\r\n" % (q.encode(), exp, len(body), noreply, body)
    if kind < 0.9:
        return b"get %s\r\n" % q.encode()
    if kind < 0.92:
        return b"status %s\r\n" % rnd.choice([b"readonly", b"up", b"up", b"up", b"quiescent", b"writeavoid"])
    if kind < 0.95:
        return b"get %s/peek\r\n" % q.encode()
    if kind < 0.98:
        # a fanout child (its master's sets then go to the collection's add) and open reads (the
        # worker then has sessions: its plain gets go through Waiting.plain_get)
        return rnd.choice([b"get a+x\r\n", b"get a/open\r\n", b"get a/close\r\n", b"get b/open\r\n",
                           b"get b/close/open\r\n", b"get a/abort\r\n"])
    return b"stats\r\n"


def reconnect(rig: Rig, i: int) -> None:
    """A connection the server closed (a bad name, a refused read) is replaced, as a client
    would reconnect."""
    c = rig.conns[i]
    if c.transport.closed:
        c.connection_lost(None)
        c = rig.conns[i] = MemcacheConn(rig.worker.front)
        c.connection_made(Transport())


def journal_bytes(rig: Rig) -> dict[str, bytes]:
    folder = rig.config.server.queue_path
    out = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out[name] = f.read()
    return out


def replies(rig: Rig, c) -> bytes:
    data = b"".join(c.transport.written)
    c.transport.written.clear()
    # stats carry the process's own uptime, pid and times: compare the rest
    return b"\r\n".join(line for line in data.split(b"\r\n")
                        if not line.startswith((b"STAT uptime", b"STAT time", b"STAT pid",
                                                b"STAT rusage", b"STAT age", b"STAT queue_")))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fused_gate_equals_the_general_path(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(clock_mod.SystemClock, "now_ms", lambda self: NOW)    # same stamps
    # (the fused set reads the system clock in C, not through now_ms: server/inline.py; with
    # the name it compares with made another class, it calls the patched method too)
    monkeypatch.setattr(inline_mod, "SystemClock", NeverFused)
    fused, general = make(str(tmp_path / "f")), make(str(tmp_path / "g"))
    try:
        general.worker.front.fused = NeverFused(general.worker.front)
        rnd = random.Random(seed)
        taken = 0
        for _ in range(200):
            batch = [(rnd.randrange(2), command(rnd)) for _ in range(rnd.randrange(1, 6))]
            for rig in (fused, general):
                for i, data in batch:
                    if not rig.conns[i].transport.closed:
                        rig.conns[i].data_received(data)
                rig.turn()
            for i in range(2):
                assert replies(fused, fused.conns[i]) == replies(general, general.conns[i]), batch
                for rig in (fused, general):
                    reconnect(rig, i)
            taken = fused.worker.front.inline_requests
        assert general.worker.front.inline_requests == 0
        assert taken > 20                           # the gate let the plain ones through
        assert journal_bytes(fused) == journal_bytes(general)
        sf, sg = fused.worker.coll.stats(), general.worker.coll.stats()
        assert sf == sg
        assert counters(fused) == counters(general)
    finally:
        fused.close()
        general.close()


def counters(rig: Rig) -> dict:
    """The front's counters, each latency family as its number of observations (the times
    themselves differ from run to run)."""
    from lanner.fronts.counters import FRONT_COUNTERS
    words = list(rig.worker.front.my.words)
    out = {}
    for name, v in zip(FRONT_COUNTERS, words):
        if name.startswith("lat_"):
            fam = name.split("_")[1]
            if not name.endswith("_sum_us"):
                out["lat_" + fam] = out.get("lat_" + fam, 0) + v
        else:
            out[name] = v
    return out


def test_a_status_change_elsewhere_is_seen_by_the_next_fused_request(tmp_path):
    """Another process's ServerStatus handle changes the shared block: the fused check
    (`seq[0] != clear`) sends the very next set through blocks_writes, which refuses it."""
    from lanner.server.status import ServerStatus
    rig = make(str(tmp_path))
    try:
        c = rig.conns[0]
        c.data_received(b"set a 0 0 1\r\nx\r\n")
        rig.turn()
        assert b"".join(c.transport.written) == b"STORED\r\n"
        st = rig.worker.front.status
        other = ServerStatus(st._mv.obj, st.status_file, st._clock)    # the same block
        assert st.clear == st.seq[0]
        other.set("ReadOnly")
        c.data_received(b"set a 0 0 1\r\ny\r\n")
        rig.turn()
        assert b"".join(c.transport.written).endswith(b"SERVER_ERROR server is ReadOnly\r\n")
        assert st.clear == -1
    finally:
        rig.close()


def test_a_new_config_clears_the_gate(tmp_path):
    """A queue the gate let through becomes an alias in a reloaded config (Front.use_config):
    the next set goes to the alias's destinations, not into the queue by the fused path."""
    import dataclasses
    rig = make(str(tmp_path))
    try:
        c = rig.conns[0]
        f = rig.worker.front
        c.data_received(b"set a 0 0 1\r\nx\r\n")
        rig.turn()
        assert f.fused["a"] is True and f.inline_requests == 1
        f.use_config(dataclasses.replace(rig.config, aliases={"a": ("b",)}))
        c.data_received(b"set a 0 0 1\r\ny\r\nget b\r\nget a\r\n")
        for _ in range(3):
            rig.turn()
        assert b"".join(c.transport.written) == b"STORED\r\nSTORED\r\nVALUE b 0 1\r\ny\r\nEND\r\nEND\r\n"
        assert f.fused["a"] is False and f.inline_requests == 1     # (`get b` waited behind a slot)
    finally:
        rig.close()
