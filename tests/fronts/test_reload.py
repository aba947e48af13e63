"""`reload` in process: a connection follows the config in force, not the one it was opened
under (issue 12); a bad file or a failing worker is an error reply and changes nothing."""
from __future__ import annotations

import pytest

from lanner.config import load_config
from lanner.ipc import control
from lanner.ipc import messages as m
from tests.fronts.harness import Rig


@pytest.fixture
def setup(tmp_path):
    path = tmp_path / "lanner.toml"
    path.write_text("[default]\nmax_item_size = 10\n")
    rig = Rig(tmp_path, config=load_config(str(path)))
    yield rig, path
    rig.close()


def set20(c) -> bytes:
    return c.ask(b"set r 0 0 20\r\n" + b"x" * 20 + b"\r\n")


def test_an_open_connection_follows_a_reloaded_max_item_size(setup):
    rig, path = setup
    c = rig.connect()
    assert set20(c) == b"NOT_STORED\r\n"
    path.write_text("[default]\nmax_item_size = 100\n")
    assert c.ask(b"reload\r\n") == b"Reloaded config.\r\n"
    assert set20(c) == b"STORED\r\n"
    assert [r.op for r in rig.worker().seen] == [m.OP_RELOAD, m.OP_SET]
    assert control.Reader(rig.supervisor_end).read() == [{"cmd": "reload_all", "front": 0}]


def test_a_bad_file_answers_the_key_and_keeps_the_config(setup):
    rig, path = setup
    c = rig.connect()
    path.write_text("[default]\nmax_item_size = 100\nbogus = 1\n")
    assert c.ask(b"reload\r\n") == b"SERVER_ERROR reload failed: default.bogus: unknown key\r\n"
    assert not c.closed
    assert rig.front.config.default.max_item_size == 10
    assert set20(c) == b"NOT_STORED\r\n"
    assert rig.worker().seen == []                    # no worker was asked to reload
    rig.supervisor_end.setblocking(False)
    with pytest.raises(BlockingIOError):
        rig.supervisor_end.recv(1)                    # nor the other fronts


def test_a_worker_that_fails_to_reload_turns_the_reply_into_an_error(setup):
    rig, path = setup
    rig.worker().reload_error = "default.x: it changed under us"
    path.write_text("[default]\nmax_item_size = 100\n")
    c = rig.connect()
    assert c.ask(b"reload\r\n") == b"SERVER_ERROR reload failed: default.x: it changed under us\r\n"


def test_another_front_follows_a_reload_before_its_next_batch_without_being_told(tmp_path):
    """Two fronts of one server share the config epoch; the one asked answers "Reloaded
    config." only after bumping it, so the other, told nothing (its control socket stays
    silent), applies the new file to the very next bytes a client sends it."""
    path = tmp_path / "lanner.toml"
    path.write_text("[default]\nmax_item_size = 10\n")
    asked = Rig(tmp_path / "a", config=load_config(str(path)))
    other = Rig(tmp_path / "b", config=load_config(str(path)), epoch=asked.front.epoch.for_child())
    try:
        c = other.connect()
        assert set20(c) == b"NOT_STORED\r\n"
        path.write_text("[default]\nmax_item_size = 100\n")
        assert asked.connect().ask(b"reload\r\n") == b"Reloaded config.\r\n"
        assert set20(c) == b"STORED\r\n"
        other.supervisor_end.setblocking(False)
        with pytest.raises(BlockingIOError):
            other.supervisor_end.recv(1)             # nobody told it
        assert not other.front.epoch.behind()
        path.write_text("[default]\nmax_item_size = 10\n")
        assert set20(c) == b"STORED\r\n"             # a file changed but not reloaded: not read
    finally:
        asked.close()
        other.close()


def test_a_bad_file_bumps_no_epoch(setup):
    rig, path = setup
    before = rig.front.epoch.start()
    path.write_text("[default]\nbogus = 1\n")
    assert rig.connect().ask(b"reload\r\n").startswith(b"SERVER_ERROR reload failed")
    assert rig.front.epoch.start() == before
