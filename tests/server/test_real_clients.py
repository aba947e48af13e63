"""Stock memcache clients, unmodified and with default settings, against `lanner serve`."""
import os
import subprocess
import threading
import time

import pytest

pytestmark = pytest.mark.integration


def _addr(server):
    return f"127.0.0.1:{server.memcache_port}"


def reliable_read_cycle(c, q: str) -> None:
    """What every stock client must be able to drive through plain get/set with Kestrel's
    suffixes: open, close, peek, abort, a plain get, and a blocking get that misses then hits."""
    assert c.set(q, b"one")
    assert c.set(q, b"two")
    assert c.get(q + "/open") == b"one"
    assert c.get(q + "/close") is None
    assert c.get(q + "/peek") == b"two"
    assert c.get(q + "/open") == b"two"
    assert c.get(q + "/abort") is None
    assert c.get(q) == b"two"
    assert c.get(q) is None
    assert c.get(q + "/t=100") is None
    c.set(q, b"three")
    assert c.get(q + "/t=1000") == b"three"


def test_pymemcache(server):
    from pymemcache.client.base import Client    # here: each client library is one test's concern
    c = Client(("127.0.0.1", server.memcache_port))
    reliable_read_cycle(c, "pm")
    result = {}

    def blocked():
        result["v"] = Client(("127.0.0.1", server.memcache_port)).get("pm/t=5000")
    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    c.set("pm", b"late")
    t.join(10)
    assert result["v"] == b"late"
    c.close()


def test_python_memcached(server):
    import memcache                               # here: each client library is one test's concern
    c = memcache.Client([_addr(server)])
    reliable_read_cycle(c, "pyq")
    c.disconnect_all()


def test_pylibmc(server):
    import pylibmc                                # here: each client library is one test's concern
    c = pylibmc.Client([_addr(server)])
    reliable_read_cycle(c, "plq")


def test_libmemcached_tools_copy_file(server, tmp_path):
    src = tmp_path / "payload"        # the key is the file name: Kestrel names have no dots
    data = os.urandom(200_000)
    src.write_bytes(data)
    servers = f"--servers={_addr(server)}"
    subprocess.run(["memccp", servers, str(src)], check=True, timeout=30, cwd=tmp_path)
    dest = tmp_path / "copied"
    subprocess.run(["memccat", servers, f"--file={dest}", "payload"], check=True, timeout=30)
    assert dest.read_bytes() == data


def test_pylibmc_binary_gets_an_error_not_a_hang(server):
    """The binary protocol is not spoken; a binary client must fail fast, not time out."""
    import pylibmc                                # here: each client library is one test's concern
    c = pylibmc.Client([_addr(server)], binary=True, behaviors={"connect_timeout": 2000,
                                                                "receive_timeout": 5_000_000})
    started = time.monotonic()
    with pytest.raises(pylibmc.Error):
        c.set("binq", b"x")
    assert time.monotonic() - started < 4
