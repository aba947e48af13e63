"""Servers for the suite's own tests: a real `lanner serve` (tests/helpers.start_server) and
Debian's memcached."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from lanner.perf.__main__ import main as perf_main
from lanner.perf.servers import start_memcached
from tests.helpers import start_server


@dataclass
class Server:
    port: int
    pid: int
    thrift_port: int | None = None


@pytest.fixture(scope="module")
def lanner(tmp_path_factory):
    handle = start_server(tmp_path_factory.mktemp("lanner"), workers=2)
    yield Server(handle.memcache_port, handle.proc.pid)
    handle.stop()


@pytest.fixture(scope="module")
def lanner_thrift(tmp_path_factory):
    handle = start_server(tmp_path_factory.mktemp("lanner-thrift"), workers=2, thrift=True)
    yield Server(handle.memcache_port, handle.proc.pid, handle.thrift_port)
    handle.stop()


@pytest.fixture(scope="module")
def memcached():
    target = start_memcached()
    yield Server(target.port, target.tree.root_pid)
    target.stop()


@pytest.fixture
def run_perf(tmp_path, capsys):
    """Run `lanner-perf ARGS` in-process; return (exit status, parsed result.json or None, stdout)."""
    def run(*argv: str):
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        rc = perf_main([*argv, "--out", str(out), "--no-progress"])
        printed = capsys.readouterr()
        found = sorted(out.glob("*/result.json"))
        return rc, (json.loads(found[0].read_text()) if found else None), printed.out + printed.err
    return run
