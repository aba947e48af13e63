"""`CmdlogStorage`: one queue's view of its partition's workq command log (the seam,
storage/seam.py).  The log itself is partition.py's, replay replay.py's, the record
format segment.py's.

Queue operations as workq commands (one record per seam call):

    record_add(item)        add: id = fresh random UUIDv4, name = queue name
                            (UTF-8), TTR 60000, TTL = expiry - add_time in ms
                            (at least 1), priority = item.priority, max-attempts
                            0, max-fails 0, payload = data, JOB_TIME = zero time,
                            JOB_CREATED = add_time.  An item that never expires
                            is written TTL 2592000000 (workq's maximum) with
                            max-fails 255: see segment.never_expires.  Lanner's
                            replay and cleaner never expire such a record, while
                            workq would drop it 30 days after creation.  An
                            expiry more than 30 days after the add is written
                            with its real TTL, which Lanner replays exactly and
                            workq would refuse ("Invalid TTL").  Any job_id the
                            item carried is replaced: every queue's item is its
                            own job, so fanout copies must be separate QItems.
                            The exception is an item handed out by due_items,
                            which is already logged: nothing is written for it.
    record_remove(item)     expire when the item's expiry has passed (the expiry
                            sweep), otherwise delete (plain get, discard, flush).
                            Replay treats the two alike: the job is gone.
    record_open(item, xid)  start-attempt (xids are not logged: replay numbers
                            leased jobs 1..n in lease order).
    record_move_open        an expired item's move to another worker's queue
                            (server/moves.py): a job that expires is first
                            logged again, delete + add under a new id with
                            max-fails 254 (segment.held_past_ttl), which
                            Lanner's replay and cleaner keep past its TTL;
                            then start-attempt, and complete once the move is
                            confirmed.  A replay before that rolls the job
                            back into the queue (it expires and moves again).
    record_confirm          complete with an empty result.
    record_unremove         timeout-attempt; the job is PENDING and goes back to
                            the head of the ready list.  For a workq job with
                            max-attempts whose attempts are used up, workq's
                            replay would FAIL it on that record, so Lanner writes
                            delete + a copy of the job's add/schedule under a new
                            id (attempts restart at 0), keeping replay equal to
                            what the live queue holds.
    erase()                 delete for every live job of the queue, then the name
                            leaves lanner-queues.json.

TTR is always written as 60000 ms and ignored: a Lanner open read never times
out unless the queue sets open_transaction_timeout.  max-attempts from workq
records is kept in the log and applied by replay exactly as workq does (a
timeout-attempt at the limit fails the job); Lanner itself never refuses an open
read for it.  workq's hard cap of 255 attempts is not applied.  max-fails is
kept and ignored, as in workq.  Job names may contain `.` (cmdlog queues only).
"""
from __future__ import annotations

from dataclasses import replace

from lanner.queues.item import QItem
from lanner.storage.cmdlog.replay import Job
from lanner.storage.cmdlog.segment import (ADD as ADD_CMD, COMPLETE, DELETE, EXPIRE, HELD_MAX_FAILS, MAX_TTL_MS, NO_EXPIRY_MAX_FAILS,
                                           START_ATTEMPT,
                                           TIMEOUT_ATTEMPT, ZERO_TIME, put_uvarint, put_varint)
from lanner.storage.seam import ReplayState

LANNER_TTR_MS = 60_000

_TTR = put_uvarint(LANNER_TTR_MS)
_NO_EXPIRY_TAIL = put_uvarint(MAX_TTL_MS) + b"\x00\x00" + put_uvarint(NO_EXPIRY_MAX_FAILS)
_HELD = b"\x00" + put_uvarint(HELD_MAX_FAILS)         # max-attempts 0, max-fails 254
_CONFIRM = bytes((18, COMPLETE))
_ADD_FIXED = 1 + 16 + len(_TTR) + 2 * 15        # type, id, TTR, JOB_TIME, JOB_CREATED


def name_str(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def name_bytes(name: str | bytes) -> bytes:
    return name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")


class CmdlogStorage:
    """One queue's view of its partition's log (the QueueStorage seam)."""

    can_read_behind = False
    in_read_behind = False
    rewrites = 0

    def __init__(self, plog, name: str, state: ReplayState | None, live: set[bytes]) -> None:
        """`plog`: the partition.PartitionLog this queue's records go into."""
        self._log = plog
        self.name = name
        self._state = state
        self._live = live
        nb = name_bytes(name)
        self._name_field = put_uvarint(len(nb)) + nb

    @property
    def sync_policy(self) -> str | int:
        return self._log.sync_policy

    def replay(self, config=None) -> ReplayState:
        """The state the partition replay rebuilt for this queue (once)."""
        st = self._state
        self._state = None
        return st if st is not None else ReplayState()

    # -- the medium: the partition's log, shared by its queues (seam.py, undo.py) ------------
    @property
    def medium(self):
        return self._log

    # -- records (each returns the mark where its record starts, or None if none is written) --
    def record_add(self, item: QItem) -> int | None:
        plog = self._log
        jid = item.job_id
        if plog._handed and jid in plog._handed:
            plog._handed.discard(jid)
            self._live.add(jid)
            return None
        mark = plog._flushed + len(plog._buf)
        self._put_add(item)
        return mark

    def _put_add(self, item: QItem, held: bool = False) -> None:
        """The add of `item` under a fresh job id (`held`: kept past its TTL, see
        record_move_open)."""
        plog = self._log
        jid = plog._new_job_id()
        item.job_id = jid
        expiry = item.expiry
        prio = item.priority
        if expiry:
            ttl = expiry - item.add_time
            mid = put_uvarint(ttl if ttl > 0 else 1) + (put_varint(prio) if prio else b"\x00") + \
                (_HELD if held else b"\x00\x00")
        elif not prio:
            mid = _NO_EXPIRY_TAIL
        else:
            mid = put_uvarint(MAX_TTL_MS) + put_varint(prio) + b"\x00" + put_uvarint(NO_EXPIRY_MAX_FAILS)
        data = item.data
        n = len(data)
        dlen = put_uvarint(n)
        name_field = self._name_field
        size = _ADD_FIXED + len(name_field) + len(mid) + len(dlen) + n
        plog._put(b"".join((plog._now_time(), put_uvarint(size), b"\x01", jid, name_field, _TTR, mid, dlen, data,
                            ZERO_TIME, plog._created_time(item.add_time))))
        self._live.add(jid)

    def record_remove(self, item: QItem) -> int | None:
        if (started := self._start(item)) is None:
            return None
        jid, plog, mark = started
        expiry = item.expiry
        plog._append_id(EXPIRE if expiry and expiry < plog._clock.now_ms() else DELETE, jid)
        self._discard(jid)
        return mark

    def record_open(self, item: QItem, xid: int) -> int | None:
        if (started := self._start(item)) is None:
            return None
        _, plog, mark = started
        return self._start_attempt(item, plog, mark)

    def record_move_open(self, item: QItem, xid: int) -> int | None:
        """An expired item leaves for another worker's queue, open until that worker has it
        (module docstring): a job with an expiry is logged again as held, once."""
        if (started := self._start(item)) is None:
            return None
        old, plog, mark = started
        if item.expiry and old not in plog._held:
            job = plog._limited.pop(old, None) if plog._limited else None
            plog._append_id(DELETE, old)
            self._live.discard(old)
            if job is None:
                self._put_add(item, held=True)
            else:                          # a workq job: its own command, max-attempts kept
                new = plog._new_job_id()
                cmd = replace(job.cmd, type=ADD_CMD, id=new, payload=item.data, max_fails=HELD_MAX_FAILS)
                plog.append_command(cmd)
                plog._limited[new] = Job(cmd, job.expire_ns, job.seq, attempts=job.attempts)
                self._live.add(new)
                item.job_id = new
            plog._held.add(item.job_id)
            self._note_relog(item.job_id, old, job)
        return self._start_attempt(item, plog, mark)

    def _start_attempt(self, item: QItem, plog, mark: int) -> int:
        jid = item.job_id
        plog._append_id(START_ATTEMPT, jid)
        if plog._limited:
            job = plog._limited.get(jid)
            if job is not None:
                job.attempts += 1
        if plog._handed:
            plog._handed.discard(jid)
        return mark

    def record_unremove(self, item: QItem, xid: int) -> int | None:
        if (started := self._start(item)) is None:
            return None
        jid, plog, mark = started
        job = plog._limited.get(jid) if plog._limited else None
        if job is not None and job.attempts >= job.cmd.max_attempts:
            self._relog(item, job)
        else:
            plog._append_id(TIMEOUT_ATTEMPT, jid)
        return mark

    def record_confirm(self, item: QItem, xid: int) -> int | None:
        if (started := self._start(item)) is None:
            return None
        jid, plog, mark = started
        plog._put(b"".join((plog._now_time(), _CONFIRM, jid, b"\x00")))
        self._discard(jid)
        return mark

    def _start(self, item: QItem) -> tuple[bytes, object, int] | None:
        """(job id, partition log, mark) for a record about a logged item; None if never logged."""
        jid = item.job_id
        if jid is None:
            return None
        plog = self._log
        return jid, plog, plog._flushed + len(plog._buf)

    def undo_record(self, kind: int, item: QItem, xid: int) -> None:
        """A record of this queue was rolled back (queues/undo.py): put the partition's
        bookkeeping back as it was before it.  (Kinds as in undo.py: 0 add, 1 remove,
        2 open, 3 abort, 4 confirm, 5 a move's open, 6 a move's confirm.)"""
        jid = item.job_id
        if jid is None:
            return
        plog = self._log
        if kind == 0:
            self._live.discard(jid)
        elif kind == 1 or kind == 4 or kind == 6:
            self._live.add(jid)
            if kind == 6 and item.expiry:
                plog._held.add(jid)         # (held when its move opened: the confirm forgot it)
        elif kind == 2 or kind == 5:
            job = plog._limited.get(jid) if plog._limited else None
            if job is not None and job.attempts:
                job.attempts -= 1
            if kind == 5:                   # the move's open had re-logged the job as held
                plog._held.discard(jid)
                self._unrelog(item)
        elif kind == 3:
            self._unrelog(item)             # the abort had re-logged the job under a new id

    def _note_relog(self, new: bytes, old: bytes, job: Job | None) -> None:
        """Job `old` was logged again as `new`: remembered while a rollback could undo it."""
        relogged = self._log._relogged
        if len(relogged) >= 1024:             # long committed: only the newest can roll back
            del relogged[next(iter(relogged))]
        relogged[new] = (old, job)

    def _unrelog(self, item: QItem) -> None:
        """Undo `_note_relog`'s re-log: the item is its old job again."""
        jid = item.job_id
        plog = self._log
        old = plog._relogged.pop(jid, None)
        if old is None:
            return
        old_id, job = old
        self._live.discard(jid)
        self._live.add(old_id)
        plog._limited.pop(jid, None)
        if job is not None:
            plog._limited[old_id] = job
        item.job_id = old_id

    def _discard(self, jid: bytes) -> None:
        self._live.discard(jid)
        plog = self._log
        if plog._limited:
            plog._limited.pop(jid, None)
        if plog._held:
            plog._held.discard(jid)
        if plog._handed:
            plog._handed.discard(jid)

    def _relog(self, item: QItem, job: Job) -> None:
        """A workq job at its max-attempts goes back to the queue: workq's replay
        would fail it on a timeout-attempt, so log it as a fresh job instead."""
        plog = self._log
        old = item.job_id
        new = plog._new_job_id()
        cmd = replace(job.cmd, id=new, payload=item.data)
        plog._append_id(DELETE, old)
        plog.append_command(cmd)
        plog._limited.pop(old, None)
        plog._limited[new] = Job(cmd, job.expire_ns, job.seq)
        self._note_relog(new, old, job)
        self._live.discard(old)
        self._live.add(new)
        item.job_id = new

    # -- the rest of the seam ---------------------------------------------------------------
    check_due = False           # the hooks below have nothing to do (seam.py, point 3)

    def before_add(self, view, config, now_ms: int) -> None:
        """Nothing: rotation happens on append and cleaning in the cleaner process."""
        self.check_due = False

    def after_remove(self, view, config, now_ms: int) -> None:
        """Nothing, as before_add."""
        self.check_due = False

    def start_read_behind(self) -> None:
        raise RuntimeError(f"cmdlog queue {self.name!r} keeps every item in memory (no read-behind)")

    def fill_read_behind(self, max_bytes: int, now_ms: int) -> list[QItem]:
        return []

    def read_back(self, mark: int) -> bool:
        return False

    @property
    def dirty(self) -> bool:
        return self._log.dirty

    def flush(self) -> None:
        self._log.flush()

    def sync(self) -> None:
        self._log.sync()

    def close(self) -> None:
        plog = self._log
        if not plog.closed:
            plog.sync()

    def erase(self) -> None:
        """Delete every live job of the queue (ready, open, scheduled), make
        that durable, then forget the queue name.  If the deletes cannot be made
        durable they are taken back and the error raised: nothing changed."""
        plog = self._log
        mark = plog.mark
        live = sorted(self._live)
        for jid in live:
            plog._append_id(DELETE, jid)
        try:
            plog.sync()
        except OSError:
            plog.rollback(mark)
            raise
        for jid in live:
            plog._scheduled.pop(jid, None)
            plog._limited.pop(jid, None)
            plog._handed.discard(jid)
            plog._held.discard(jid)
        self._live.clear()
        self._state = None
        plog._forget(self.name)

    @property
    def logsize(self) -> int:
        return self._log.logsize

    @property
    def rotations(self) -> int:
        return self._log.rotations

    @property
    def live_jobs(self) -> int:
        """Jobs of this queue alive in the log (queued, open or scheduled)."""
        return len(self._live)
