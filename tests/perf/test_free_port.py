"""Where `free_port` finds a port for a server about to start (perf/servers.py)."""

import socket

import pytest

from lanner.perf import servers
from lanner.perf.servers import ServerError, below_ephemeral, free_port


def ephemeral_first() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_without_a_range_the_port_is_below_the_kernels_ephemeral_range(monkeypatch):
    """A port the kernel picks for a bind to 0 is one it also hands to outgoing connections,
    which can take it before the server binds (CI: "Address already in use"): below that range
    no outgoing connection is given it."""
    monkeypatch.delenv(servers.PORTS_ENV, raising=False)
    monkeypatch.setattr(servers, "_next_port", [])
    first = ephemeral_first()
    ports = [free_port() for _ in range(20)]
    assert all(max(1024, first - 10_000) <= p < first for p in ports), ports
    assert len(set(ports)) == 20                    # walked, not handed out twice at once
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))                # and free


def test_a_port_taken_is_passed_over(monkeypatch):
    monkeypatch.delenv(servers.PORTS_ENV, raising=False)
    lo, _ = below_ephemeral()
    monkeypatch.setattr(servers, "_next_port", [lo])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", lo))
        assert free_port() == lo + 1


def test_lanner_ports_keeps_to_its_range_and_says_when_it_is_full(monkeypatch):
    monkeypatch.setattr(servers, "_next_port", [])
    with socket.socket() as a:
        a.bind(("127.0.0.1", 0))
        port = a.getsockname()[1]
        monkeypatch.setenv(servers.PORTS_ENV, f"{port}-{port}")
        with pytest.raises(ServerError, match=f"LANNER_PORTS={port}-{port}: no free port"):
            free_port()
    monkeypatch.setattr(servers, "_next_port", [])
    assert free_port() == port


def test_no_room_below_the_ephemeral_range_lets_the_kernel_pick(monkeypatch):
    monkeypatch.delenv(servers.PORTS_ENV, raising=False)
    monkeypatch.setattr(servers, "below_ephemeral", lambda: (1, 0))
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
