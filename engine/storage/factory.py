"""A worker's storages: Kestrel journals for its queues, workq command logs for its partitions.

Packing never runs in the worker: when a journal in read-behind finishes its
checkpoint file (reference §6.5) the worker hands the pack request to the
cleaner process and carries on; the cleaner writes the `.pack` file and the
journal adopts it when the reply comes back.  Command-log partitions with the
`interval` sync policy are fsynced from a helper thread on a timer, and the
cleaner rewrites their closed segments on its own schedule.
"""
from __future__ import annotations

import logging
import os

from lanner.ipc import control
from lanner.queues.placement import partition_of, partitions_of_worker
from lanner.storage.seam import MemoryStorage

log = logging.getLogger(__name__)

PACK_PATIENCE_MS = 600_000     # packing 1 GiB takes seconds; ten minutes means the cleaner is gone


class ShardStorage:
    def __init__(self, config, clock, worker: int, nworkers: int, cleaner_sock=None):
        self.config = config
        self.clock = clock
        self.queue_path = config.server.queue_path
        self.cleaner = cleaner_sock
        self.partitions = partitions_of_worker(worker, nworkers)
        self._logs: dict[int, object] = {}
        self._journals: dict[str, object] = {}
        self._packs: dict[int, tuple] = {}        # request id -> (journal, sent at ms)
        self._next_pack = 1
        self._next_cmdlog_sync: int | None = None
        self._next_pack_check = 0
        self.collection = None                     # set by the worker once it exists
        self.run_in_thread = _run_inline           # the worker hands in its fsync pool

    # -- the factory the QueueCollection calls -------------------------------------------------
    def __call__(self, name: str, qc):
        if qc.storage == "cmdlog":
            return self.partition_log(partition_of(name)).storage_for(name)
        from lanner.storage.journal.journal import Journal
        if not qc.keep_journal:
            Journal.erase_all(self.queue_path, name)
            return MemoryStorage()
        j = Journal(self.queue_path, name, self.clock, qc.sync_journal,
                    inline_pack=self.cleaner is None)
        self._journals[name] = j
        return j

    def partition_log(self, partition: int):
        plog = self._logs.get(partition)
        if plog is None:
            from lanner.storage.cmdlog.cmdlog import open_partition_logs
            plog = open_partition_logs(self.queue_path, [partition], self.clock,
                                       self.config.cmdlog)[partition]
            self._logs[partition] = plog
            if self.config.cmdlog.sync == "interval" and self._next_cmdlog_sync is None:
                self._next_cmdlog_sync = self.clock.now_ms() + self.config.cmdlog.sync_interval
        return plog

    def queue_names(self) -> list[str]:
        """Queues held in this shard's command-log partitions (journal queues are files)."""
        root = os.path.join(self.queue_path, "cmdlog")
        names = []
        for p in self.partitions:
            if os.path.isdir(os.path.join(root, str(p))):
                names.extend(self.partition_log(p).queue_names())
        return names

    # -- timers the worker drives --------------------------------------------------------------
    def next_deadlines(self) -> list[int]:
        out = [self._next_cmdlog_sync] if self._next_cmdlog_sync is not None else []
        if self.cleaner is not None:     # checkpoints to pack, packs the cleaner never answered
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
        if self._next_cmdlog_sync is not None and now_ms >= self._next_cmdlog_sync:
            self._next_cmdlog_sync = now_ms + self.config.cmdlog.sync_interval
            logs = list(self._logs.values())
            for plog in logs:
                plog.flush()
            self.run_in_thread(sync_all, logs)
        if self.cleaner is not None and now_ms >= self._next_pack_check:
            self._next_pack_check = now_ms + 100
            for rid, (j, sent) in list(self._packs.items()):
                if now_ms - sent > PACK_PATIENCE_MS:
                    # the cleaner died with it (or hangs): forget it, the journal asks again
                    log.warning("queue %r: no answer from the cleaner for a pack in %d s; asking again",
                                j.name, PACK_PATIENCE_MS // 1000)
                    del self._packs[rid]
                    j.pack_done(None)
            for j in self._journals.values():
                if j.checkpoint is not None:
                    req = j.pack_due()
                    if req is not None:
                        self.request_pack(j, req)

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


class PackedFile:
    """What `Journal.pack_done` needs of a pack the cleaner wrote."""
    __slots__ = ("out_path",)

    def __init__(self, out_path: str):
        self.out_path = out_path


def sync_all(storages) -> None:
    """fsync each of `storages` (journals or partition logs), logging failures."""
    for st in storages:
        try:
            st.sync()
        except OSError as e:
            log.error("fsync failed: %s", e)


def _run_inline(fn, *args) -> None:
    fn(*args)
