"""The storage factory: the one place that decides where a queue's items live and makes
its storage (a `QueueCollection` calls it for every queue it creates, in the server and in
stand-alone use alike).

* `storage_home(qc)`: keep_journal = false means memory, whatever `storage` says (the
  config's "false: items live in memory only"); otherwise `storage`: a Kestrel journal
  per queue, or the workq command log of the queue's partition.
* `check_home`: data on disk wins; items stored in the other home refuse the queue.

A `StorageFactory` serves the partitions of one worker (all 64 stand-alone).  Packing
never runs in the worker: when a journal in read-behind finishes its checkpoint file
(reference §6.5) the worker hands the pack request to the cleaner process and carries on;
the cleaner writes the `.pack` file and the journal adopts it when the reply comes back.
Without a cleaner (stand-alone) journals pack inline.  The cleaner also rewrites
command-log segments on its own schedule; when records are fsynced is storage/sync.py's.
"""
from __future__ import annotations

import logging
import os

from lanner.ipc import control
from lanner.queues.placement import partition_of, partitions_of_worker
from lanner.storage.cmdlog.partition import open_partition_logs, partition_dir
from lanner.storage.journal.files import files_by_queue, stored_items
from lanner.storage.journal.journal import Journal
from lanner.storage.seam import MemoryStorage

log = logging.getLogger(__name__)


class StorageMismatch(ValueError):
    """A queue's items are stored where its configuration does not look (issue 11, defect 9):
    serving it would show an empty queue over stored items, so start-up (or the creation)
    stops with this one line naming the queue, where its items are and the setting."""


def storage_home(qc) -> str:
    """Where a queue with config `qc` keeps its items: "memory" (keep_journal = false, for
    either storage kind: etc/lanner.toml's "false: items live in memory only"), "journal"
    or "cmdlog"."""
    return "memory" if not qc.keep_journal else qc.storage


def _setting(qc) -> str:
    return "keep_journal = false" if not qc.keep_journal else f'storage = "{qc.storage}"'


def check_home(name: str, qc, queue_path: str, plog) -> None:
    """Data on disk wins.  Before `name` is served from its configured home, look in the
    other one (`plog`: the command log of its partition, None if that has no directory):
    stored items there raise StorageMismatch; an empty queue left there is dropped (logged),
    so the name does not come back from it.  Journal files under keep_journal = false are
    erased by the factory as Kestrel does (reference §6.1).  `name` must already be free of
    path separators (config.validate_queue_name with dots allowed)."""
    home = storage_home(qc)
    if home != "cmdlog" and plog is not None and plog.has_queue(name):
        n = plog.live_count(name)
        if n:
            raise StorageMismatch(
                f"queue {name!r}: {n} items are stored in the command log {plog.dir}, but its "
                f"configuration says {_setting(qc)}, which would serve it empty; set storage = "
                f'"cmdlog" (and keep_journal = true) for [queues."{name}"] again, or empty the '
                f"queue under that setting first")
        plog.storage_for(name).erase()
        log.info("queue %r: dropped from the command log %s, where it held no items (%s now)",
                 name, plog.dir, _setting(qc))
    if home == "cmdlog" and "." not in name and os.path.isfile(os.path.join(queue_path, name)):
        n = stored_items(queue_path, name)
        if n != 0:
            held = f"{n} items are" if n is not None else "unreadable records are"
            raise StorageMismatch(
                f"queue {name!r}: {held} stored in its journal {os.path.join(queue_path, name)}, but "
                f'its configuration says storage = "cmdlog", which would serve it empty; set '
                f'storage = "journal" for [queues."{name}"] again, or empty the queue under that '
                f"setting first")
        Journal.erase_all(queue_path, name)
        log.info("queue %r: removed its journal files, which held no items (storage = \"cmdlog\" now)",
                 name)

PACK_PATIENCE_MS = 600_000     # packing 1 GiB takes seconds; ten minutes means the cleaner is gone


class StorageFactory:
    """`factory(name, queue_config)` makes a queue's storage; `queue_names()` lists the
    command-log queues of its partitions (journal queues are found as files)."""

    def __init__(self, config, clock, worker: int = 0, nworkers: int = 1, cleaner_sock=None):
        self.config = config
        self.clock = clock
        self.queue_path = config.server.queue_path
        self.cleaner = cleaner_sock
        self.partitions = partitions_of_worker(worker, nworkers)
        self._logs: dict[int, object] = {}
        self._journals: dict[str, object] = {}
        # journals with a checkpoint set or a rewrite being written (they register themselves,
        # `_checkpointed`): the only ones `tick` looks at, so a tick costs what needs packing or
        # adopting, not one step per queue (issue 8: 10,000 queues made it 10,000 steps ten
        # times a second)
        self._attention: dict[str, object] = {}
        # the worker's `note_deadline`: a journal that registers wants a tick soon, and the
        # worker's timer is re-armed only for what announces itself (shardloop.py arm_timer)
        self.on_deadline = None
        self._packs: dict[int, tuple] = {}        # request id -> (journal, sent at ms)
        self._next_pack = 1
        self._next_pack_check = 0
        self.collection = None                     # set by the worker once it exists
        # The queue directory listed once, at the first journal opened (`_listing`): per name,
        # its files then.  A name's entry goes to the journal that opens it; from then on the
        # journal's own rotations and packs change its files, so a name opened (or erased)
        # again is listed afresh (`_touched`).  Issue 8: listing 10,000 files per new queue made
        # creating 10,000 queues quadratic.
        self._boot_files: dict[str, list[str]] | None = None
        self._touched: set[str] = set()

    # -- the factory the QueueCollection calls -------------------------------------------------
    def check_home(self, name: str, qc) -> None:
        p = partition_of(name)
        plog = self.partition_log(p) if os.path.isdir(partition_dir(self.queue_path, p)) else None
        if storage_home(qc) == "cmdlog":
            self._touched.add(name)      # check_home may erase its journal files
        check_home(name, qc, self.queue_path, plog)

    def _listing(self, name: str) -> list[str] | None:
        """The files of journal queue `name` as the start-up listing found them ([] if none),
        or None (list the directory) if the name was opened or erased since."""
        if name in self._touched or "." in name:
            return None
        self._touched.add(name)
        if self._boot_files is None:
            try:
                self._boot_files = files_by_queue(self.queue_path)
            except FileNotFoundError:
                self._boot_files = {}
        return self._boot_files.pop(name, [])

    def __call__(self, name: str, qc):
        home = storage_home(qc)
        if home == "memory":
            if qc.storage == "journal":                      # Kestrel drops old journals (§6.1)
                Journal.erase_all(self.queue_path, name, self._listing(name))
            return MemoryStorage()
        if home == "cmdlog":
            return self.partition_log(partition_of(name)).storage_for(name)
        os.makedirs(self.queue_path, exist_ok=True)
        j = Journal(self.queue_path, name, self.clock, qc.sync_journal,
                    inline_pack=self.cleaner is None, listing=self._listing(name))
        if self.cleaner is not None:
            j.on_checkpoint = self._checkpointed
        self._journals[name] = j
        return j

    def partition_log(self, partition: int):
        plog = self._logs.get(partition)
        if plog is None:
            plog = open_partition_logs(self.queue_path, [partition], self.clock,
                                       self.config.cmdlog)[partition]
            self._logs[partition] = plog
        return plog

    def queue_names(self) -> list[str]:
        """Queues held in this factory's command-log partitions (journal queues are files).  A
        queue with live jobs in a partition that is not its own (a workq log copied into one
        partition's directory) is logged: a queue's storage is its own partition's log
        (placement.py), so those jobs are not served, and a silent count would hide them."""
        names = []
        for p in self.partitions:
            if os.path.isdir(partition_dir(self.queue_path, p)):
                plog = self.partition_log(p)
                for name in plog.queue_names():
                    home = partition_of(name)
                    stray = plog.live_count(name) if home != p else 0
                    if stray:
                        log.warning("queue %r: %d live jobs in command-log partition %d (%s) are not served: "
                                    "the queue's partition is %d (%s)", name, stray, p,
                                    partition_dir(self.queue_path, p), home,
                                    partition_dir(self.queue_path, home))
                    names.append(name)
        return names

    def close(self) -> None:
        """Close every partition log (flush, fsync, release its lock), even if one fails."""
        error = None
        for plog in self._logs.values():
            try:
                plog.close()
            except OSError as e:
                error = error or e
        if error is not None:
            raise error

    # -- timers the worker drives --------------------------------------------------------------
    def next_deadlines(self) -> list[int]:
        out = []
        if self._attention or self._packs:     # checkpoints to pack, packs the cleaner never answered
            out.append(self._next_pack_check)
        for plog in self._logs.values():
            due = plog.next_due()
            if due is not None:
                out.append(due)
        return out

    def release_scheduled(self, now_ms: int) -> None:
        """workq `schedule` records found in a log: each job joins its queue when its time comes."""
        for plog in self._logs.values():
            due = plog.next_due()
            if due is None or due > now_ms:
                continue
            for name, item in plog.due_items(now_ms):
                q = self.collection.queue(name)
                q.admit(item)

    def tick(self, now_ms: int) -> None:
        if self.collection is not None:
            self.release_scheduled(now_ms)
        if (self._attention or self._packs) and now_ms >= self._next_pack_check:
            self._next_pack_check = now_ms + 100
            for rid, (j, sent) in list(self._packs.items()):
                if now_ms - sent > PACK_PATIENCE_MS:
                    # the cleaner died with it (or hangs): forget it, the journal asks again
                    log.warning("queue %r: no answer from the cleaner for a pack in %d s; asking again",
                                j.name, PACK_PATIENCE_MS // 1000)
                    del self._packs[rid]
                    j.pack_done(None)
            for name, j in list(self._attention.items()):
                req = j.pack_due()             # adopts a finished rewrite; None until the reader
                if req is not None:            # has left the files
                    self.request_pack(j, req)
                elif j.checkpoint is None and not j.rewrite_pending:
                    del self._attention[name]  # packed (or covered by a rewrite): done with it

    def _checkpointed(self, journal) -> None:
        """A journal's hook (`on_checkpoint`): it set a checkpoint, or its rewrite is being
        written, so `tick` asks it for its pack (and so adopts the rewrite) from now on until
        both are done."""
        if self._journals.get(journal.name) is journal:
            self._attention[journal.name] = journal
            if self.on_deadline is not None:
                self.on_deadline(self._next_pack_check)

    def request_pack(self, journal, req) -> None:
        rid = self._next_pack
        self._next_pack += 1
        self._packs[rid] = (journal, self.clock.now_ms())
        try:
            control.send(self.cleaner, {"cmd": "pack", "id": rid, "files": list(req.files),
                                        "out": req.out_path, "open_xids": list(req.open_xids)})
        except OSError as e:
            log.error("cannot reach the cleaner for a pack of %s: %s", req.out_path, e)
            self._packs.pop(rid, None)

    def on_cleaner_reply(self, msg) -> None:
        if msg.get("cmd") != "packed":
            return
        entry = self._packs.pop(msg["id"], None)
        if entry is None:
            return               # a pack given up on (see tick): its temporary file is ignored
        j = entry[0]
        if msg.get("ok"):
            j.pack_done(PackedFile(msg["out_path"]))
        else:
            log.error("queue %r: pack failed in the cleaner: %s", j.name, msg.get("error"))
            j.pack_done(None)

    def forget(self, name: str) -> None:
        self._journals.pop(name, None)
        self._attention.pop(name, None)


class PackedFile:
    """What `Journal.pack_done` needs of a pack the cleaner wrote."""
    __slots__ = ("out_path",)

    def __init__(self, out_path: str):
        self.out_path = out_path

