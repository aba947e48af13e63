"""A real ZooKeeper for the tests: Debian's `zookeeper` package, started as a plain
java process on 127.0.0.1 with a temporary data dir and a free port."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from tests.helpers import free_port

ZK_JAR = "/usr/share/java/zookeeper.jar"       # its manifest's Class-Path names the rest
JAVA = shutil.which("java")


def available() -> str | None:
    """None when a ZooKeeper can be started here, else why not."""
    if JAVA is None:
        return "no java on PATH"
    if not os.path.exists(ZK_JAR):
        return f"{ZK_JAR} missing: install Debian's zookeeper package (.ci/run does)"
    return None


class ZooKeeper:
    def __init__(self, base: str) -> None:
        self.base = base
        self.port = free_port()
        self.data = os.path.join(base, "data")
        self.proc: subprocess.Popen | None = None
        os.makedirs(self.data, exist_ok=True)
        self.cfg = os.path.join(base, "zoo.cfg")
        with open(self.cfg, "w") as f:
            f.write(f"tickTime=500\ndataDir={self.data}\nclientPort={self.port}\n"
                    "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
                    "4lw.commands.whitelist=ruok\nmaxClientCnxns=0\nminSessionTimeout=1000\n")

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        log = open(os.path.join(self.base, "zookeeper.log"), "ab")
        self.proc = subprocess.Popen(
            [JAVA, "-Xmx96m", "-XX:+UseSerialGC", "-Dzookeeper.admin.enableServer=false",
             "-cp", ZK_JAR, "org.apache.zookeeper.server.ZooKeeperServerMain", self.cfg],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"zookeeper exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.5) as s:
                    s.sendall(b"ruok")
                    if s.recv(4) == b"imok":
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("zookeeper did not answer ruok")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    why = available()
    if why:
        pytest.skip(f"ZooKeeper cannot run here: {why}")
    zk = ZooKeeper(str(tmp_path_factory.mktemp("zk")))
    zk.start()
    yield zk
    zk.stop()


def wait_for(pred, timeout: float = 15.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: {pred}")
        time.sleep(interval)
