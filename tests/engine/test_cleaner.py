"""The cleaner's long work runs in a forked child while its heart keeps beating."""
from __future__ import annotations

import os
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
