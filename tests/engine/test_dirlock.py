"""The data-directory lock in one process (server/dirlock.py); the server-level
behaviour is in tests/server/test_dirlock.py."""
import os

import pytest

from lanner.server import dirlock


def test_second_lock_names_the_holder_and_release_frees_it(tmp_path):
    qp, st = tmp_path / "q", tmp_path / "s" / "status"
    qp.mkdir()
    fds = dirlock.lock_server(str(qp), str(st))
    assert open(dirlock.queue_lock_path(str(qp))).read() == f"{os.getpid()}\n"
    assert dirlock.live_holder(str(qp)) == os.getpid()
    assert dirlock.live_holder(str(qp / "cmdlog" / "3")) == os.getpid()   # a partition below it
    with pytest.raises(dirlock.DirLocked, match=f"queue path {qp} is in use by another lanner "
                                                f"server \\(pid {os.getpid()}\\)"):
        dirlock.lock_server(str(qp), str(tmp_path / "other"))
    other = tmp_path / "q2"
    other.mkdir()
    with pytest.raises(dirlock.DirLocked, match=f"status file {st} is in use"):
        dirlock.lock_server(str(other), str(st))
    assert dirlock.live_holder(str(other)) is None          # the failed attempt left no lock
    msg = dirlock.refuse_live([str(qp / "jobs")], ignore_lock=False)
    assert str(qp) in msg and "--ignore-lock" in msg
    assert dirlock.refuse_live([str(qp / "jobs")], ignore_lock=True) is None
    for fd in fds:
        os.close(fd)
    assert dirlock.live_holder(str(qp)) is None
    assert dirlock.refuse_live([str(qp / "jobs")], ignore_lock=False) is None
    # a stale file (its server gone) is simply locked again
    for fd in dirlock.lock_server(str(qp), str(st)):
        os.close(fd)
