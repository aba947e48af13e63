"""The cleaner's long work runs in a forked child while its heart keeps beating."""
from __future__ import annotations

import os
import time

from lanner.server import cleaner


class RecordingHeart:
    interval = 0.02

    def __init__(self):
        self.beats = []

    def beat(self, now):
        self.beats.append(now)


def test_a_long_rewrite_keeps_the_heart_beating(tmp_path, monkeypatch):
    (tmp_path / "cmdlog" / "0").mkdir(parents=True)
    seen = tmp_path / "rewritten"

    def slow_rewrite(d, clock):
        time.sleep(0.3)
        seen.write_text(str(os.getpid()))
        return {}

    monkeypatch.setattr(cleaner, "rewrite_segments", slow_rewrite)
    heart = RecordingHeart()
    assert cleaner.run_rewrites(str(tmp_path), heart)
    assert int(seen.read_text()) != os.getpid()       # it ran in a child
    assert len(heart.beats) >= 5                       # and the parent beat meanwhile


def test_a_crashing_rewrite_is_reported_not_raised(tmp_path, monkeypatch):
    (tmp_path / "cmdlog" / "0").mkdir(parents=True)

    def crash(d, clock):
        os._exit(3)

    monkeypatch.setattr(cleaner, "rewrite_segments", crash)
    assert cleaner.run_rewrites(str(tmp_path), RecordingHeart()) is False
