"""Issue 12's size rule for the tree, rechecked on every run: no module of the server, the
protocols or the perf tools is over MAX_LINES lines.  A module that grows past it has taken on
a second job; split it along its seams (conn.py's slots, lifecycle and whitelists; syncer.py's
gather and threads; collection.py's forwarding; supervisor.py's reaping) rather than squeeze it."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("engine", "protocols", "perf")
MAX_LINES = 600


def line_counts() -> dict[str, int]:
    """Lines of every .py under FOLDERS, by its path from the repository root."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            with path.open("rb") as f:
                out[path.relative_to(ROOT).as_posix()] = sum(1 for _ in f)
    return out


def test_the_folders_hold_modules():
    counts = line_counts()
    for folder in FOLDERS:
        assert any(p.startswith(folder + "/") for p in counts), f"no .py found under {folder}/"


def test_no_module_is_over_the_limit():
    over = {p: n for p, n in line_counts().items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (issue 12): " + \
        ", ".join(f"{p} ({n})" for p, n in sorted(over.items()))
