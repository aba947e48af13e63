"""The journal rewrite's slow half runs on the writer thread (compaction.py `_rewrite`, issue 8:
its fsyncs stalled every queue of the worker for 0.1-0.6 s under a flood).  In-process, with the
thread's fsyncs injected (recorded, or held at a gate) so each step can be looked at: the owner
never fsyncs, the dump becomes a `.pack` only after its fsync, the pack is adopted only after the
directory fsync, and a crash (a copy of the directory replayed) at every step replays the same
queue."""
from __future__ import annotations

import os
import shutil
import threading

from lanner.config import QueueConfig
from lanner.queues.item import QItem
from lanner.storage.journal import compaction as C, journal as J
from lanner.storage.journal.files import archived_files
from lanner.storage.journal.journal import Journal
from tests.engine.test_journal import View

T = 1_700_000_000_000
CFG = QueueConfig(default_journal_size=1024)     # small, so a rewrite comes due at once


def journal(path, clock, writer) -> Journal:
    j = Journal(str(path), "q", clock)
    j.replay(QueueConfig())
    j.writer = writer
    return j



def on_thread_fsync(monkeypatch, hook) -> None:
    """Journal fsyncs call `hook()` first when another thread (the writer) makes them."""
    owner = threading.get_ident()

    def fsync(fd):
        if threading.get_ident() != owner:
            hook()
        os.fsync(fd)
    monkeypatch.setattr(J, "_fsync", fsync)


def held(entered: threading.Event, gate: threading.Event):
    """A hook that says it was entered, then waits for `gate`."""
    def hold(*_):
        entered.set()
        assert gate.wait(10)
    return hold

def fill_then_empty(j, opened: QItem) -> None:
    """Past default_journal_size with nothing queued and one item open (the dump holds it)."""
    item = QItem(T, 0, b"x" * 100)
    for _ in range(12):
        j.record_add(item)
        j.record_remove(item)
    j.record_add(opened)
    j.record_open(opened, 1)
    j.flush()


def replayed(path, tmp_path, tag: str) -> tuple[list[bytes], list[bytes]]:
    """A crash now: the directory as it is, replayed by a fresh journal (queued, open datas).
    A file the writer's thread unlinks while the copy is made (an adopted rewrite's `.old`
    archive) is left out, as a crash just after that unlink would leave it: the copy is one of
    the two states a crash can see, either of which must replay the same queue."""
    copy = tmp_path / f"crash-{tag}"
    shutil.copytree(path, copy, copy_function=copy_if_there)
    j = Journal(str(copy), "q", _Clock())
    st = j.replay(QueueConfig())
    j.close()
    return [i.data for i in st.items], sorted(i.data for i in st.open_transactions.values())


def copy_if_there(src, dst) -> None:
    try:
        shutil.copy2(src, dst)
    except FileNotFoundError:
        if os.path.exists(src):
            raise


class _Clock:
    def now_ms(self) -> int:
        return T + 10 ** 6

    def monotonic(self) -> float:
        return 0.0


def test_the_rewrites_fsyncs_run_on_the_writer_thread_not_the_owners(tmp_path, clock, writer, monkeypatch):
    d = tmp_path / "d"
    d.mkdir()
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(J, "_fsync", lambda fd: (calls.append(("file", threading.get_ident())), os.fsync(fd)))
    real_dir = C.fsync_dir
    monkeypatch.setattr(C, "fsync_dir", lambda p: (calls.append(("dir", threading.get_ident())), real_dir(p)))
    j = journal(d, clock, writer)
    opened = QItem(T, 0, b"open")
    fill_then_empty(j, opened)
    j.after_remove(View([], {1: opened}), CFG, T)
    job = getattr(j, "_rewrite_job", None)
    if job is not None:
        job[0].wait()
    j.after_remove(View([], {1: opened}), CFG, T)          # the next operation adopts it
    assert j.rewrites == 1
    assert {kind for kind, _ in calls} == {"file", "dir"}
    assert all(tid != threading.get_ident() for _, tid in calls), calls
    writer.run(lambda: None).wait()     # the adopted archive's unlink is queued on the thread
    assert sorted(os.listdir(d)) == ["q"]                   # Kestrel's layout: one file
    assert replayed(d, tmp_path, "end") == ([], [b"open"])
    j.close()


def test_the_pack_appears_and_is_adopted_only_after_its_fsyncs(tmp_path, clock, writer, monkeypatch):
    """Hold the dump's fsync, then the directory's: at each step the owner goes on writing, the
    old files stay, and a crash replays the same queue."""
    d = tmp_path / "d"
    d.mkdir()
    file_gate, dir_gate = threading.Event(), threading.Event()
    in_file, in_dir = threading.Event(), threading.Event()
    on_thread_fsync(monkeypatch, held(in_file, file_gate))
    real_dir, hold_dir = C.fsync_dir, held(in_dir, dir_gate)

    def fsync_dir(p):
        hold_dir()
        real_dir(p)
    monkeypatch.setattr(C, "fsync_dir", fsync_dir)
    j = journal(d, clock, writer)
    opened = QItem(T, 0, b"open")
    fill_then_empty(j, opened)
    view = View([], {1: opened})
    j.after_remove(view, CFG, T)
    assert in_file.wait(10)
    # the dump is being fsynced: no pack yet, the old file is archived, the owner still writes
    names = sorted(os.listdir(d))
    assert not any(n.endswith(".pack") for n in names) and len(archived_files(str(d), "q")) == 1
    new = QItem(T, 0, b"after")
    j.record_add(new)
    j.flush()
    j.after_remove(view, CFG, T)
    assert j.rewrites == 0
    assert replayed(d, tmp_path, "dump-fsync") == ([b"after"], [b"open"])
    file_gate.set()
    assert in_dir.wait(10)
    # renamed to a .pack, the directory not yet fsynced: not adopted, nothing deleted
    assert any(n.endswith(".pack") for n in os.listdir(d))
    j.after_remove(view, CFG, T)
    assert j.rewrites == 0 and j._rewrite_job is not None
    assert replayed(d, tmp_path, "dir-fsync") == ([b"after"], [b"open"])
    dir_gate.set()
    j._rewrite_job[0].wait()
    j.after_remove(view, CFG, T)
    assert j.rewrites == 1 and j._rewrite_job is None
    arch = archived_files(str(d), "q")
    assert len(arch) == 1 and j.archived_size == os.path.getsize(d / arch[0])   # the dump, as an archive
    assert replayed(d, tmp_path, "adopted") == ([b"after"], [b"open"])
    j.close()
    assert replayed(d, tmp_path, "closed") == ([b"after"], [b"open"])


def test_close_waits_for_a_rewrite_under_way(tmp_path, clock, writer, monkeypatch):
    d = tmp_path / "d"
    d.mkdir()
    gate, started = threading.Event(), threading.Event()
    on_thread_fsync(monkeypatch, held(started, gate))
    j = journal(d, clock, writer)
    opened = QItem(T, 0, b"open")
    fill_then_empty(j, opened)
    j.after_remove(View([], {1: opened}), CFG, T)
    assert started.wait(10)
    closer = threading.Thread(target=j.close)
    closer.start()
    closer.join(0.2)                     # a bounded wait that the close must NOT finish in
    assert closer.is_alive()
    gate.set()
    closer.join(10)
    assert not closer.is_alive() and j.rewrites == 1
    assert replayed(d, tmp_path, "closed") == ([], [b"open"])


def test_a_failed_dump_leaves_the_archive_and_loses_nothing(tmp_path, clock, writer, monkeypatch, caplog):
    d = tmp_path / "d"
    d.mkdir()

    def fail():
        raise OSError(5, "Input/output error")
    on_thread_fsync(monkeypatch, fail)
    j = journal(d, clock, writer)
    opened = QItem(T, 0, b"open")
    fill_then_empty(j, opened)
    j.after_remove(View([], {1: opened}), CFG, T)
    j._rewrite_job[0].wait()
    j.record_add(QItem(T, 0, b"after"))
    j.flush()
    j.after_remove(View([], {1: opened}), CFG, T)
    assert j.rewrites == 0 and "rewrite stopped half way" in caplog.text
    assert not any("~~" in n or n.endswith(".pack") for n in os.listdir(d))
    assert replayed(d, tmp_path, "failed") == ([b"after"], [b"open"])
    j.close()


def test_the_dump_is_encoded_off_the_loop_and_later_records_land_after_it(tmp_path, monkeypatch):
    """Issue 8: a rewrite of a big in-memory queue built its whole dump on the loop (0.5-0.6 s
    for 200k 1 KiB items), and renaming the current file over its reserved archive name made
    ext4 write the file's dirty pages out on the loop.  Now the loop takes a snapshot (item
    references) and renames to a free name; the writer's thread encodes and writes the dump.
    Records the queue takes meanwhile land after it: replay sees both, in order."""
    from lanner.clock import FakeClock
    from lanner.config import Config, ServerConfig
    from lanner.queues.collection import QueueCollection
    from lanner.storage.writer import Writer

    clock = FakeClock(T)
    cfg = Config(server=ServerConfig(queue_path=str(tmp_path / "q")),
                 default=QueueConfig(max_memory_size=1 << 30, max_journal_size=1 << 40,
                                     default_journal_size=1 << 40),
                 queue_overrides={}, aliases={})
    coll = QueueCollection(cfg, clock)
    q = coll.queue("q")
    j = q.storage
    r, w = os.pipe()
    j.writer = Writer(w)
    for i in range(1000):
        coll.add("q", b"%04d" % i)
    coll.flush_storages()

    loop_thread = threading.current_thread()
    encoded_on = []
    real_pack = C.pack_addx

    def pack_addx(*a):
        encoded_on.append(threading.current_thread())
        return real_pack(*a)
    monkeypatch.setattr(C, "pack_addx", pack_addx)
    gate = threading.Event()
    real_files = C._rewrite_files

    def held(*a):
        assert gate.wait(10)
        real_files(*a)
    monkeypatch.setattr(C, "_rewrite_files", held)
    renamed_over = []
    real_rename = os.rename

    def rename(src, dst):
        if os.path.exists(dst) and os.path.basename(str(src)) == "q":
            renamed_over.append(dst)
        real_rename(src, dst)
    monkeypatch.setattr(os, "rename", rename)

    assert j._rewrite(q)
    assert encoded_on == [] and renamed_over == []       # nothing encoded on the loop
    for i in range(1000, 1010):                          # after the snapshot
        coll.add("q", b"%04d" % i)
    assert coll.remove("q").data == b"0000"
    coll.flush_storages()
    gate.set()
    j._adopt_rewrite(block=True)
    assert j.rewrites == 1 and encoded_on and loop_thread not in encoded_on
    coll.close()
    j.writer.close()
    os.close(r)
    os.close(w)

    again = QueueCollection(cfg, clock)
    got = []
    while (item := again.remove("q")) is not None:
        got.append(item.data)
    assert got == [b"%04d" % i for i in range(1, 1010)]
    again.close()
