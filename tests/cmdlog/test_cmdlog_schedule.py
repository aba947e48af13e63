"""workq `schedule` records found in a command log: the job joins its queue when its time comes."""
import os
import uuid

from lanner.clock import FakeClock
from lanner.storage.cmdlog.partition import PartitionLog
from lanner.queues.collection import QueueCollection
from lanner.config import load_config
from lanner.queues.placement import partition_of
from lanner.storage.cmdlog.segment import JobCommand
from lanner.storage.factory import StorageFactory

NOW = 1_795_000_000_000


def write_schedule(queue_path, name, payload, at_ms, clock):
    d = os.path.join(queue_path, "cmdlog", str(partition_of(name)))
    os.makedirs(d)
    plog = PartitionLog(d, clock, sync_policy="os")
    plog.append_command(JobCommand(2, uuid.uuid4().bytes, name.encode(), 60000, 2_592_000_000, 0, 0, 0,
                                   payload, at_ms * 1_000_000, NOW * 1_000_000))
    plog.flush()
    plog.close()


def test_scheduled_job_is_served_at_its_time(tmp_path):
    clock = FakeClock(NOW)
    qp = str(tmp_path / "q")
    cfg = load_config(None, {"queue_path": qp})
    cfg = type(cfg)(server=cfg.server, default=cfg.default, queue_overrides={"report": {"storage": "cmdlog"}},
                    aliases=cfg.aliases, cmdlog=cfg.cmdlog, path=None)
    write_schedule(qp, "report", b"monthly", NOW + 5000, clock)
    factory = StorageFactory(cfg, clock, 0, 1)
    coll = QueueCollection(cfg, clock, storage_factory=factory, autoflush=False)
    factory.collection = coll
    coll.load()
    assert "report" in coll.names()
    assert coll.remove("report") is None
    assert NOW + 5000 in factory.next_deadlines()
    clock.advance(4999)
    factory.tick(clock.now_ms())
    assert coll.remove("report") is None
    clock.advance(1)
    factory.tick(clock.now_ms())
    item = coll.remove("report")
    assert item is not None and item.data == b"monthly"
    coll.close()
