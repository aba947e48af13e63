"""ZooKeeper server sets against a real ZooKeeper (Debian's zookeeper package)."""
from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from lanner.config import ZooKeeperConfig
from lanner.ops.serverset import ServerSet, member_data, sets_for
from tests.helpers import start_server
from tests.ops.zk import wait_for, zookeeper  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def client(zookeeper):  # noqa: F811
    from kazoo.client import KazooClient
    c = KazooClient(hosts=zookeeper.hosts, timeout=5)
    c.start(timeout=15)
    yield c
    c.stop()
    c.close()


def members(client, path):
    """{child: (data dict, ephemeral owner)} of a server set (empty when the path is missing)."""
    if not client.exists(path):
        return {}
    out = {}
    for child in client.get_children(path):
        try:
            data, stat = client.get(f"{path}/{child}")
        except Exception:
            continue
        out[child] = (json.loads(data), stat.ephemeralOwner)
    return out


def test_membership_follows_status(zookeeper, client):  # noqa: F811
    cfg = ZooKeeperConfig(hosts=zookeeper.hosts, path_prefix="/unit/a", session_timeout=4000)
    ss = ServerSet(cfg, member_data("h", {"memcache": 1, "text": 2}))
    ss.start()
    try:
        for status, expect in (("Up", {"write", "read"}), ("ReadOnly", {"read"}),
                               ("WriteAvoid", {"read"}), ("Quiescent", set()), ("Up", {"write", "read"})):
            assert sets_for(status) == expect
            ss.want(sets_for(status))
            wait_for(ss.reconcile)
            for name in ("write", "read"):
                got = members(client, f"/unit/a/{name}")
                assert len(got) == (1 if name in expect else 0), (status, name, got)
    finally:
        ss.stop()
    assert members(client, "/unit/a/write") == {} and members(client, "/unit/a/read") == {}


def test_member_data_is_serverset_json():
    doc = json.loads(member_data("db1", {"memcache": 22133, "thrift": 2229, "text": 2222, "admin": 2223}))
    assert doc == {"serviceEndpoint": {"host": "db1", "port": 22133},
                   "additionalEndpoints": {"memcache": {"host": "db1", "port": 22133},
                                           "thrift": {"host": "db1", "port": 2229},
                                           "text": {"host": "db1", "port": 2222}},
                   "status": "ALIVE"}
    assert json.loads(member_data("h", {"thrift": 9, "text": 8}))["serviceEndpoint"]["port"] == 9
    assert json.loads(member_data("h", {"text": 8}))["serviceEndpoint"]["port"] == 8


def mc(server, line: bytes) -> bytes:
    with server.connect() as s:
        s.sendall(line)
        return s.recv(4096)


def zk_child_pid(server) -> int:
    def find():
        for p in psutil.Process(server.proc.pid).children():
            try:
                if p.name() == "lanner-zk":
                    return p.pid
            except psutil.Error:
                pass
        return None
    return wait_for(find)


def test_server_joins_leaves_and_survives_zookeeper(zookeeper, client, tmp_path):  # noqa: F811
    grace = 1.5
    prefix = "/lanner/it"
    server = start_server(tmp_path, thrift=True, config=f"""
[server]
status_change_grace_period = "{int(grace * 1000)}ms"

[zookeeper]
hosts = "{zookeeper.hosts}"
path_prefix = "{prefix}"
session_timeout = "2s"
""")
    write, read = prefix + "/write", prefix + "/read"
    try:
        # Up: both sets, with every client listener in the member data
        wait_for(lambda: members(client, write) and members(client, read))
        (data, owner), = members(client, read).values()
        assert data["serviceEndpoint"] == {"host": "127.0.0.1", "port": server.memcache_port}
        assert data["additionalEndpoints"]["thrift"]["port"] == server.thrift_port
        assert data["additionalEndpoints"]["text"]["port"] == server.text_port
        assert data["status"] == "ALIVE"

        # ReadOnly: reported at once, enforced (and /write left) after the grace period
        t0 = time.monotonic()
        assert mc(server, b"status readonly\r\n") == b"END\r\n"
        assert members(client, write), "left /write before the grace period ended"
        wait_for(lambda: not members(client, write))
        assert time.monotonic() - t0 >= grace - 0.05
        assert members(client, read)

        # Quiescent: neither set
        mc(server, b"status quiescent\r\n")
        wait_for(lambda: not members(client, read))
        assert not members(client, write)

        # Up is looser: both sets again without waiting for a grace period
        t0 = time.monotonic()
        mc(server, b"status up\r\n")
        wait_for(lambda: members(client, write) and members(client, read))
        assert time.monotonic() - t0 < grace

        # ZooKeeper goes away: the server keeps serving; a status change while it is away
        # is applied when it comes back (same data dir, so the session survives)
        zookeeper.stop()
        assert mc(server, b"set during_outage 0 0 2\r\nhi\r\n") == b"STORED\r\n"
        mc(server, b"status readonly\r\n")
        time.sleep(grace + 0.2)           # nothing to wait on: ZooKeeper is down
        assert mc(server, b"get during_outage\r\n") == b"VALUE during_outage 0 2\r\nhi\r\nEND\r\n"
        zookeeper.start()
        wait_for(lambda: client.connected, timeout=20)
        wait_for(lambda: members(client, read) and not members(client, write), timeout=20)
        mc(server, b"status up\r\n")
        wait_for(lambda: members(client, write))

        # the session expires (the zk process frozen past session_timeout): rejoin with a new one
        (_, old_owner), = members(client, read).values()
        pid = zk_child_pid(server)
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: not members(client, read), timeout=20)   # ZooKeeper expired it
            assert mc(server, b"set frozen 0 0 1\r\nx\r\n") == b"STORED\r\n"
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: members(client, read) and members(client, write), timeout=20)
        (_, new_owner), = members(client, read).values()
        assert new_owner != old_owner
    finally:
        assert server.stop() == 0
    # a clean shutdown leaves at once (not after the session timeout)
    assert not members(client, read) and not members(client, write)
    assert "joined " + read in server.log()
