"""Issue 2 (queue engine and Kestrel journals) rechecked after the re-layout: the README's
"Lanner as a library" example runs as printed, and `lanner qdump` / `lanner qpack` show a
progress bar on a terminal for files over a few MiB (and never when stderr is not one)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from lanner.storage.journal.codec import encode_add
from lanner.queues.item import QItem
from lanner.tools.qtools import PROGRESS_MIN_BYTES
from tests.terminal import run_on_a_terminal

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def library_example() -> str:
    text = open(README, encoding="utf-8").read()
    section = text.split("## Lanner as a library", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "README's 'Lanner as a library' has one python example"
    return blocks[0]


def test_the_readme_library_example_runs_as_printed(tmp_path):
    """The example in a fresh interpreter, with only its queue path pointed at tmp_path: it
    prints the item it read, and its confirmed read leaves the journal of an empty queue."""
    code, n = re.subn(r'("queue_path": )"[^"]*"', lambda m: m.group(1) + repr(str(tmp_path / "myqueues")),
                      library_example())
    assert n == 1, "the example names its queue_path"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "b'resize photo 17'\n"
    assert os.listdir(tmp_path / "myqueues") == ["jobs"]
    r = subprocess.run([sys.executable, "-m", "lanner.cli", "qdump", "-q", str(tmp_path / "myqueues" / "jobs")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "0 items totalling 0 bytes." in r.stdout, r.stdout + r.stderr


@pytest.fixture(scope="module")
def big_journal(tmp_path_factory):
    """A journal a little over PROGRESS_MIN_BYTES."""
    path = tmp_path_factory.mktemp("big") / "big"
    rec = encode_add(QItem(1_700_000_000_000, 0, b"x" * 1024))
    n = PROGRESS_MIN_BYTES // len(rec) + 100
    path.write_bytes(rec * n)
    return str(path), n


def test_qdump_shows_a_progress_bar_on_a_terminal_for_a_big_journal(big_journal):
    path, n = big_journal
    code, out, term = run_on_a_terminal(["qdump", "-q", path])
    assert code == 0
    assert b"%d items totalling %d bytes." % (n, n * 1024) in out
    assert b"Reading journal:" in term and b"%|" in term, term[:300]
    r = subprocess.run([sys.executable, "-m", "lanner.cli", "qdump", "-q", path], capture_output=True,
                       timeout=60)
    assert r.returncode == 0 and r.stderr == b""      # not a terminal: no bar


def test_qpack_shows_a_progress_bar_on_a_terminal_for_big_journals(big_journal, tmp_path):
    path, _n = big_journal
    code, out, term = run_on_a_terminal(["qpack", "-f", str(tmp_path / "packed"), path])
    assert code == 0
    assert out.startswith(b"Packing journals...\n") and b"Done. New journal size: " in out
    assert b"Packing:" in term and b"%|" in term, term[:300]
    assert os.path.getsize(tmp_path / "packed") == os.path.getsize(path)


def test_no_progress_bar_for_a_small_journal_even_on_a_terminal(tmp_path):
    path = tmp_path / "small"
    path.write_bytes(encode_add(QItem(1_700_000_000_000, 0, b"hello")))
    code, out, term = run_on_a_terminal(["qdump", "-q", str(path)])
    assert code == 0 and b"1 items totalling 5 bytes." in out
    assert b"%|" not in term
