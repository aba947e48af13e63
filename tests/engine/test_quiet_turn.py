"""The quiet turn (ShardLoop.end_quiet_turn): a worker's one connection ends its turn in one
straight line while nothing is behind, held or woken, and in every other case exactly as the
general batch end (end_turn) would."""
from __future__ import annotations

import asyncio
import os
import random

import pytest

from lanner.config import load_config
from lanner.perf.hotloop import NullTransport, Rig
from lanner.queues import collection
from lanner.queues.undo import UndoLog
from lanner.server import commit
from lanner.server.local import LocalFront
from lanner.server import worker as worker_module
from lanner.server.worker import Worker
from tests.engine.test_turn import HoldingUring, counting

BEHIND = 4096      # write-behind threshold in the equivalence runs: some sets go to the writer


class JournalAtWrite(NullTransport):
    """Records, at each reply write, how many bytes the queue's journal file held then."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.journal_sizes: list[int] = []

    def write(self, data: bytes) -> None:
        self.journal_sizes.append(os.path.getsize(self.path))
        super().write(data)


class CountedFront(LocalFront):
    """A worker's own front that counts its flush_writes (LocalFront is a C type in the compiled
    build: its class cannot be patched).  `flushes`: one entry per call."""
    __slots__ = ("flushes",)

    def flush_writes(self) -> None:
        self.flushes.append(1)
        LocalFront.flush_writes(self)


def general_ends(monkeypatch, worker) -> None:
    """`worker` ends its quiet turns as the general path does, by end_turn (patched on the class,
    for it alone: a worker has slots, no dict)."""
    real = Worker.end_quiet_turn

    def end_quiet_turn(self) -> None:
        if self is worker:
            self.end_turn()
        else:
            real(self)
    monkeypatch.setattr(Worker, "end_quiet_turn", end_quiet_turn)


def make_rig(tmp_path, name: str, policy: str = "never") -> Rig:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "lanner.toml").write_text('[default]\nsync_journal = "%s"\n' % policy)
    config = load_config(str(folder / "lanner.toml"), {"queue_path": str(folder / "q"),
                                                       "status_file": str(folder / "status")})
    return Rig(str(folder), 1, config=config)


def test_a_quiet_turn_skips_the_general_batch_end_and_writes_the_journal_first(tmp_path, monkeypatch):
    """A set, then a get, each its own turn on the worker's one connection: both end in
    end_quiet_turn without end_turn, finish_batch, publish or flush_writes (their frames are
    what a turn of `mixed -c 1` paid for), and each reply leaves after its record's write."""
    rig = Rig(str(tmp_path), 1, transport=lambda: JournalAtWrite(str(tmp_path / "q" / "q")),
              front_class=CountedFront)
    try:
        w = rig.worker
        c = rig.conns[0]
        general = [counting(monkeypatch, w, m) for m in ("end_turn", "finish_batch", "publish")]
        w.front.flushes = []
        general.append(w.front.flushes)
        c.data_received(b"set q 0 0 3\r\nabc\r\n")
        first = os.path.getsize(tmp_path / "q" / "q")
        c.data_received(b"get q\r\n")
        assert b"".join(c.transport.written) == b"STORED\r\nVALUE q 0 3\r\nabc\r\nEND\r\n"
        assert c.transport.journal_sizes[0] == first > 3          # the add's record first
        assert c.transport.journal_sizes[1] > first                 # the remove's record first
        assert general == [[], [], [], []] and not w.turn_scheduled
    finally:
        rig.close()


def test_a_turn_with_a_write_under_way_takes_the_general_end(tmp_path, monkeypatch):
    """A set big enough to go to the writer's thread: its turn's batch goes to finish_batch
    (the reply waits for that write), and the next turn, with the write under way or just
    taken, is not quiet: end_turn."""
    monkeypatch.setattr(commit, "WRITE_BEHIND_BYTES", BEHIND)
    rig = Rig(str(tmp_path), 1)
    try:
        w = rig.worker
        c = rig.conns[0]
        batches = counting(monkeypatch, w, "finish_batch")
        big = b"x" * BEHIND
        c.data_received(b"set q 0 0 %d\r\n%s\r\n" % (len(big), big))
        assert batches == [1] and w.writing and w.write_held      # behind: the reply waits
        ends = counting(monkeypatch, w, "end_turn")
        c.data_received(b"get q\r\n")
        assert ends == [1]
        settle(rig)
        assert b"".join(c.transport.written) == b"STORED\r\nVALUE q 0 %d\r\n%s\r\nEND\r\n" % (
            len(big), big)
    finally:
        rig.close()


def settle(rig: Rig) -> None:
    """Turn the worker's loop until nothing is under way: no turn due, no write behind, no
    fsync round, no reply held."""
    w = rig.worker
    loop = w.loop
    deadline = loop.time() + 10
    while w.turn_scheduled or w.writing or w.write_held or w.held or w.syncer.rounds or \
            w.sync_queue or w.settled:
        assert loop.time() < deadline, "the worker did not settle"
        rig.turn()
        if w.writing or w.syncer.rounds:
            loop.run_until_complete(_tick())


async def _tick() -> None:
    """Let the loop wait a moment for a thread's or the kernel's completion."""
    await asyncio.sleep(0.001)


def script(seed: int) -> list[bytes]:
    """Random chunks of one connection's input: sets (small and past BEHIND, with and without
    expiry or noreply), plain gets, open/close/abort/peek reads, deletes, two queues, some
    chunks pipelining several commands.  Nothing that closes the connection: while a read may
    be open on a queue (after any `/open`), only `/close`, `/abort`, `/close/open` and peeks
    read it."""
    rnd = random.Random(seed)
    out = []
    n = 0
    opened = set()
    for _ in range(120):
        chunk = b""
        for _ in range(rnd.choice((1, 1, 1, 2, 3))):
            q = rnd.choice((b"a", b"a", b"b"))
            op = rnd.random()
            if op < 0.45:
                n += 1
                data = (b"%d." % n) * rnd.choice((1, 3, BEHIND // 3 + 1))
                exp = rnd.choice((0, 0, 0, 100000))
                chunk += b"set %s 0 %d %d%s\r\n%s\r\n" % (q, exp, len(data),
                                                          rnd.choice((b"", b"", b" noreply")), data)
            elif op < 0.9 and q in opened:
                verb = rnd.choice((b"close", b"abort", b"close/open", b"peek"))
                chunk += b"get %s/%s\r\n" % (q, verb)
                if verb in (b"close", b"abort"):
                    opened.discard(q)
            elif op < 0.75:
                chunk += b"get %s\r\n" % q
            elif op < 0.82:
                chunk += b"get %s/open\r\n" % q
                opened.add(q)
            elif op < 0.9:
                chunk += b"get %s/peek\r\n" % q
            elif q not in opened:
                chunk += b"delete %s\r\n" % q
        out.append(chunk)
    for q in opened:
        out.append(b"get %s/abort\r\n" % q)
    return out


@pytest.mark.parametrize("policy", ["never", "always", "10ms"])
@pytest.mark.parametrize("seed", [1, 2])
def test_quiet_turns_answer_as_the_general_batch_end(tmp_path, monkeypatch, policy, seed):
    """The same random input on two workers' one connection, one ending its turns by
    end_quiet_turn, the other by end_turn always (the general path): the same replies, in
    the same order, and the same items left; under each sync policy, with writes going
    behind the writer's thread now and then."""
    monkeypatch.setattr(commit, "WRITE_BEHIND_BYTES", BEHIND)
    quiet = make_rig(tmp_path, "quiet", policy)
    general = make_rig(tmp_path, "general", policy)
    try:
        general_ends(monkeypatch, general.worker)
        ends = counting(monkeypatch, quiet.worker, "end_turn")
        chunks = script(seed)
        general_chunks = 0
        for chunk in chunks:
            before = len(ends)
            for rig in (quiet, general):
                rig.conns[0].data_received(chunk)
                settle(rig)
            general_chunks += len(ends) > before
            assert b"".join(quiet.conns[0].transport.written) == \
                b"".join(general.conns[0].transport.written)
        assert 0 < general_chunks < len(chunks)     # both ways were taken
        for rig in (quiet, general):
            rig.conns[0].data_received(b"get a\r\nget b\r\n" * 100)
            settle(rig)
        assert b"".join(quiet.conns[0].transport.written) == \
            b"".join(general.conns[0].transport.written)
    finally:
        quiet.close()
        general.close()


def test_under_sync_always_a_quiet_turns_reply_waits_for_its_fsync(tmp_path, monkeypatch):
    """A quiet turn whose write needs an fsync ("always") goes on as finish_batch: the STORED
    leaves only after the fsync round, which the loop reports.  The fdatasync is held until the
    test releases it: a fast disk could return it within the turn, and finish_batch would then
    rightly send the STORED at once."""
    made = []
    monkeypatch.setattr(worker_module, "open_uring",
                        lambda: made.append(HoldingUring(str(tmp_path / "always" / "q" / "q"))) or made[0])
    rig = make_rig(tmp_path, "always", "always")
    try:
        w = rig.worker
        c = rig.conns[0]
        c.data_received(b"set q 0 0 1\r\nx\r\n")
        [uring] = made
        assert not c.transport.written and w.syncer.rounds and uring.calls == 1
        rig.turn()
        assert not c.transport.written                    # still held: the reply waits for it
        uring.release()
        settle(rig)
        assert c.transport.written == [b"STORED\r\n"]
    finally:
        rig.close()


@pytest.mark.parametrize("policy", ["never", "always", "10ms"])
def test_the_trim_a_write_hints_forgets_only_committed_records(tmp_path, monkeypatch, policy):
    """write_out names the journal it wrote through, and UndoLog.trim then takes its records as
    committed without asking it: over the random input (writes behind, fsync rounds, two
    queues), every time, each record of that journal is committed indeed, and the quiet and
    the general batch end still answer alike."""
    monkeypatch.setattr(commit, "WRITE_BEHIND_BYTES", BEHIND)
    hinted = []

    class CheckedUndo(UndoLog):
        """The rigs' undo logs (a C type compiled, undo.pxd: its methods cannot be patched)."""

        def trim(self, through=None):
            if through is not None:
                hinted.append(through)
                assert all(e[1] < through.committed_mark for e in self.entries if e[0] is through)
            return super().trim(through)
    monkeypatch.setattr(collection, "UndoLog", CheckedUndo)
    quiet = make_rig(tmp_path, "quiet", policy)
    general = make_rig(tmp_path, "general", policy)
    try:
        general_ends(monkeypatch, general.worker)
        for chunk in script(3):
            for rig in (quiet, general):
                rig.conns[0].data_received(chunk)
                settle(rig)
        assert b"".join(quiet.conns[0].transport.written) == \
            b"".join(general.conns[0].transport.written)
        assert hinted if policy != "always" else not hinted     # "always": committed at the fsync
    finally:
        quiet.close()
        general.close()


@pytest.mark.parametrize("policy, listed", [("never", True), ("10ms", False)])
def test_a_turn_that_recorded_nothing_writes_nothing(tmp_path, policy, listed, monkeypatch):
    """A get of an empty queue records nothing.  Under sync "never" its journal is still
    listed for the batch's write (QueueCollection.dirty_storages does not ask `dirty`, a
    property's frame per turn), where Journal.flush does nothing; under a period it is not
    listed once its records are fsynced, so no fsync is scheduled for it.  Either way: no
    write, the same reply."""
    rig = make_rig(tmp_path, "empty", policy)
    try:
        w = rig.worker
        c = rig.conns[0]
        c.data_received(b"set q 0 0 1\r\nx\r\nget q\r\n")
        settle(rig)
        w.coll.queue("q").storage.sync()            # (the period's fsync, not waited for)
        path = os.path.join(w.config.server.queue_path, "q")
        size = os.path.getsize(path)
        c.transport.written.clear()
        written = counting(monkeypatch, w, "write_out")
        c.data_received(b"get q\r\n")
        settle(rig)
        assert c.transport.written == [b"END\r\n"]
        assert os.path.getsize(path) == size
        assert len(written) == (1 if listed else 0)
    finally:
        rig.close()
