"""perf/standin.c, the C stand-in with Lanner's syscalls and a chosen CPU cost per request: it
answers as a one-queue server, it really spends the cost, and `compare --a standin:US` runs it."""
from __future__ import annotations

import socket

import pytest

from lanner.perf import loadgen
from lanner.perf.__main__ import main as perf_main
from lanner.perf.compare import make_target
from lanner.perf.context import ScenarioError
from lanner.perf.loadgen import Load
from lanner.perf.servers import start_standin


def exchange(sock: socket.socket, data: bytes, expect_len: int) -> bytes:
    sock.sendall(data)
    out = b""
    while len(out) < expect_len:
        chunk = sock.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


@pytest.fixture
def standin():
    target = start_standin(0)
    yield target
    target.stop()


def test_a_get_returns_the_oldest_item_and_journals_each_turn(standin):
    with socket.create_connection((standin.host, standin.port), timeout=10) as s:
        assert exchange(s, b"set q 5 0 3\r\none\r\nset q 0 0 3\r\ntwo\r\n", 16) == b"STORED\r\nSTORED\r\n"
        reply = b"VALUE q/open 5 3\r\none\r\nEND\r\nVALUE q 0 3\r\ntwo\r\nEND\r\nEND\r\n"
        assert exchange(s, b"get q/open\r\nget q\r\nget q\r\n", len(reply)) == reply
        assert exchange(s, b"set q 0 0 1 noreply\r\nx\r\nversion\r\n", 17) == b"VERSION standin\r\n"
    # one record per set (opcode 2, length, 4 bytes of expiry, data) and per get (opcode 3)
    with open(f"{standin.workdir}/journal", "rb") as f:
        journal = f.read()
    add = b"\x02%s\x00\x00\x00\x00%s"
    assert journal == (add % (b"\x03\x00\x00\x00", b"one") + add % (b"\x03\x00\x00\x00", b"two") +
                       b"\x03\x03" + add % (b"\x01\x00\x00\x00", b"x"))


def test_an_unknown_command_gets_a_client_error_and_a_close(standin):
    with socket.create_connection((standin.host, standin.port), timeout=10) as s:
        assert exchange(s, b"set q 0 0 1\r\nx\r\ndelete q\r\n", 1000) == \
            b"STORED\r\nCLIENT_ERROR unknown command\r\n"


def test_the_burn_is_cpu_the_server_really_spends():
    """200 requests at 2 ms each: the stand-in spends 0.4 s of CPU on them, however busy the box
    (the spin runs until its thread has had that much more CPU).  The kernel reports process
    CPU in 10 ms ticks, rounded at both readings: 0.3 s is asked (without the spin: ~0.01 s)."""
    target = start_standin(2000)
    try:
        cpu0 = target.tree.cpu_seconds()
        res = loadgen.run(Load(port=target.port, conns=1, sets=100, gets=100, value_size=64, queue="b"))
        assert res["errors"] == 0 and res["ops"] == 200
        assert target.tree.cpu_seconds() - cpu0 >= 0.3
    finally:
        target.stop()


def test_compare_takes_standin_with_its_cost_and_refuses_a_bad_one(capsys, tmp_path):
    with pytest.raises(ScenarioError, match="standin:US"):
        make_target("standin:fast", None, None)
    code = perf_main(["compare", "--a", "standin:0", "--rounds", "1", "--no-progress", "mixed",
                      "-c", "2", "-s", "300", "-g", "300", "-i", "64", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "standin" in out and "memcached" in out
