"""The cleaner's long work (a pack on a thread, a rewrite in a forked child) runs while its heart
keeps beating."""
from __future__ import annotations

import os
import threading
import time

from lanner.server import cleaner


class RecordingHeart:
    """Counts beats; after `signal_after` of them it creates `flag`, which a child waits for."""
    interval = 0.01

    def __init__(self, flag=None, signal_after=5):
        self.beats = []
        self.flag = flag
        self.signal_after = signal_after

    def beat(self, now):
        self.beats.append(now)
        if self.flag is not None and len(self.beats) == self.signal_after:
            self.flag.write_text("beating")


def test_a_long_rewrite_keeps_the_heart_beating(tmp_path, monkeypatch):
    (tmp_path / "cmdlog" / "0").mkdir(parents=True)
    seen = tmp_path / "rewritten"
    flag = tmp_path / "parent-beat-5-times"

    def slow_rewrite(d, clock):
        """A rewrite that lasts until the parent has beaten five times (or 30 s)."""
        deadline = time.monotonic() + 30
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.write_text(f"{os.getpid()} {flag.exists()}")
        return {}

    monkeypatch.setattr(cleaner, "rewrite_segments", slow_rewrite)
    heart = RecordingHeart(flag)
    assert cleaner.run_rewrites(str(tmp_path), heart)
    pid, beaten = seen.read_text().split()
    assert int(pid) != os.getpid()                     # it ran in a child
    assert beaten == "True"                            # while the parent's heart kept beating


def test_a_crashing_rewrite_is_reported_not_raised(tmp_path, monkeypatch):
    (tmp_path / "cmdlog" / "0").mkdir(parents=True)

    def crash(d, clock):
        os._exit(3)

    monkeypatch.setattr(cleaner, "rewrite_segments", crash)
    assert cleaner.run_rewrites(str(tmp_path), RecordingHeart()) is False


def test_a_long_pack_runs_on_a_thread_of_the_cleaner_while_its_heart_beats(tmp_path, monkeypatch):
    """Not in a forked child: the child's copy-on-write was 1.6 MB of the server's peak at a
    1 GiB backlog (issue 8, perf memory)."""
    flag = tmp_path / "beat-5-times"
    seen = []

    def slow_pack(files, out, open_xids, now_ms):
        """A pack that lasts until the cleaner's heart has beaten five times (or 30 s)."""
        deadline = time.monotonic() + 30
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.append((os.getpid(), threading.current_thread() is threading.main_thread(), flag.exists(),
                     files, out, open_xids))

    monkeypatch.setattr(cleaner, "pack_files", slow_pack)
    reply = cleaner.run_pack({"cmd": "pack", "id": 7, "files": ["a", "b"], "out": "o", "open_xids": [3]},
                             RecordingHeart(flag))
    assert reply == {"cmd": "packed", "id": 7, "ok": True, "out_path": "o"}
    assert seen == [(os.getpid(), False, True, ["a", "b"], "o", [3])]   # here, on a thread, heart beating


def test_a_failing_pack_is_reported_not_raised(tmp_path, monkeypatch, caplog):
    def broken(files, out, open_xids, now_ms):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cleaner, "pack_files", broken)
    reply = cleaner.run_pack({"cmd": "pack", "id": 8, "files": ["a"], "out": "o"}, RecordingHeart())
    assert reply["ok"] is False and reply["id"] == 8 and "No space left" in reply["error"]
    assert "pack into o failed" in caplog.text


def test_a_pack_through_the_cleaner_writes_the_packed_journal(tmp_path):
    from lanner.queues.item import QItem
    from lanner.storage.journal.codec import encode_add, encode_remove
    (tmp_path / "q.1").write_bytes(b"".join([encode_add(QItem(1, 0, b"one")), encode_add(QItem(2, 0, b"two")),
                                             encode_remove()]))
    reply = cleaner.run_pack({"cmd": "pack", "id": 9, "files": [str(tmp_path / "q.1")],
                              "out": str(tmp_path / "q.pack"), "open_xids": []})
    assert reply == {"cmd": "packed", "id": 9, "ok": True, "out_path": str(tmp_path / "q.pack")}
    assert (tmp_path / "q.pack").read_bytes() == encode_add(QItem(2, 0, b"two"))
