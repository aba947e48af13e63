"""Stock memcache clients, unmodified and with default settings, against `lanner serve`."""
import os
import subprocess
import threading
import time

import pytest

pytestmark = pytest.mark.integration


def _addr(server):
    return f"127.0.0.1:{server.memcache_port}"


def test_pymemcache(server):
    from pymemcache.client.base import Client
    c = Client(("127.0.0.1", server.memcache_port))
    assert c.set("pm", b"one")
    assert c.set("pm", b"two")
    assert c.get("pm/open") == b"one"
    assert c.get("pm/close") is None
    assert c.get("pm/peek") == b"two"
    assert c.get("pm/open") == b"two"
    assert c.get("pm/abort") is None
    assert c.get("pm") == b"two"
    assert c.get("pm") is None
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
    import memcache
    c = memcache.Client([_addr(server)])
    assert c.set("pyq", b"alpha")
    assert c.set("pyq", b"beta")
    assert c.get("pyq/open") == b"alpha"
    assert c.get("pyq/close") is None
    assert c.get("pyq/peek") == b"beta"
    assert c.get("pyq/t=100") == b"beta"
    assert c.get("pyq/t=100") is None
    c.set("pyq", b"gamma")
    assert c.get("pyq/open") == b"gamma"
    assert c.get("pyq/abort") is None
    assert c.get("pyq") == b"gamma"
    c.disconnect_all()


def test_pylibmc(server):
    import pylibmc
    c = pylibmc.Client([_addr(server)])
    assert c.set("plq", b"x1")
    assert c.set("plq", b"x2")
    assert c.get("plq/open") == b"x1"
    assert c.get("plq/close") is None
    assert c.get("plq/peek") == b"x2"
    assert c.get("plq/open") == b"x2"
    assert c.get("plq/abort") is None
    assert c.get("plq") == b"x2"
    assert c.get("plq/t=100") is None
    c.set("plq", b"x3")
    assert c.get("plq/t=1000") == b"x3"


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
    import pylibmc
    c = pylibmc.Client([_addr(server)], binary=True, behaviors={"connect_timeout": 2000,
                                                                "receive_timeout": 5_000_000})
    started = time.monotonic()
    with pytest.raises(pylibmc.Error):
        c.set("binq", b"x")
    assert time.monotonic() - started < 4
