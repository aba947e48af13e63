"""The offline tools, run as a user runs them, tell the truth in their exit status (issue 11,
defect 10)."""
import subprocess
import sys

from lanner.queues.item import QItem
from lanner.storage.journal.codec import encode_add


def lanner(*args, cwd):
    r = subprocess.run([sys.executable, "-m", "lanner.cli", *args], capture_output=True, text=True,
                       timeout=60, cwd=cwd)
    return r.returncode, r.stdout, r.stderr


def test_tools_exit_nonzero_on_what_they_cannot_do(tmp_path):
    (tmp_path / "notes.txt").write_text("not a journal\n")
    (tmp_path / "q").write_bytes(encode_add(QItem(1, 0, b"x")))
    (tmp_path / "q.1").write_bytes(encode_add(QItem(1, 0, b"y")))
    (tmp_path / "empty").mkdir()

    assert lanner("qdump", "notes.txt", cwd=tmp_path)[0] == 1
    code, out, _ = lanner("qdump", "-q", "q", "q.1", cwd=tmp_path)
    assert code == 0 and out.count("Queue: ") == 2 and "Queue: q.1\n" in out
    assert lanner("qpack", "q", cwd=tmp_path)[0] == 2                      # no -f
    assert lanner("qpack", "-f", "packed", "q", "q.1", cwd=tmp_path)[0] == 0
    code, _, err = lanner("qpack", "-f", "packed", "q", cwd=tmp_path)       # exists: not without --force
    assert code == 1 and "--force" in err
    assert lanner("qpack", "--force", "-f", "packed", "q", cwd=tmp_path)[0] == 0
    code, out, err = lanner("cmdlog", "check", "empty", cwd=tmp_path)
    assert code == 1 and "ok" not in out and "no command-log segments" in err
