"""lanner-journal: items mode against the server's own replay, records mode against the
engine's reader, several spools, pruning, and exact re-reads while the server appends."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("pyspark")

from lanner.clock import FakeClock                                       # noqa: E402
from lanner.spark import _journal as JR                                  # noqa: E402
from lanner.spark.journal_source import ITEMS_SCHEMA, JournalReader      # noqa: E402
from lanner.storage.journal.codec import JournalCorrupt, read_records    # noqa: E402
from lanner.storage.journal.replay import JournalReplayError             # noqa: E402

from .journals import T0, build_spool, open_queue, close, payload, server_items  # noqa: E402

QUEUES = ["broken", "legacy", "packed", "plain", "rot", "torn", "tx"]


@pytest.fixture(scope="module")
def spool(tmp_path_factory):
    d = tmp_path_factory.mktemp("spool")
    clock = FakeClock(T0)
    build_spool(str(d / "queues"), clock)
    return str(d / "queues"), clock.now_ms(), str(d)


def _items(df):
    rows = df.selectExpr("queue", "position", "unix_millis(add_time) AS add_ms",
                         "coalesce(unix_millis(expiry), 0) AS exp_ms", "data", "spool").collect()
    out: dict[str, list] = {}
    for r in sorted(rows, key=lambda r: (r.queue, r.position)):
        out.setdefault(r.queue, []).append(r)
    return out


def test_items_match_the_servers_replay(spark, spool):
    path, now, tmp = spool
    names = sorted(n for n in os.listdir(path))
    assert any(n.endswith(".pack") for n in names), names          # an uninstalled pack is there
    assert any(n.startswith("rot.") for n in names), names         # rot rotated
    before = {n: os.path.getsize(os.path.join(path, n)) for n in names}
    got = _items(spark.read.format("lanner-journal").option("now", str(now)).load(path))
    assert sorted(got) == QUEUES
    for q in QUEUES:
        expect = server_items(path, q, now, tmp)
        rows = got[q]
        assert [r.position for r in rows] == list(range(len(rows)))
        assert [(r.add_ms, r.exp_ms, bytes(r.data)) for r in rows] == expect, q
        assert {r.spool for r in rows} == {path}
    # spot checks that the scenarios did what they claim
    assert [bytes(r.data) for r in got["legacy"]] == [b"a", b"e", b"g"]
    assert len(got["torn"]) == 9
    assert len(got["broken"]) < 25
    with pytest.raises(JournalReplayError, match="queue 'broken': archived journal"):
        server_items(path, "broken", now, tmp, cut=False)   # the server itself refuses it
    # reading never touches the spool: the pack is still uninstalled, nothing truncated
    assert {n: os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)} == before


def test_items_expiry_and_include_expired(spark, spool):
    path, now, _ = spool
    df = spark.read.format("lanner-journal").option("now", str(now)).option("queues", "tx")
    live = df.load(path).collect()
    every = df.option("includeExpired", "true").load(path).collect()
    assert len(every) > len(live)
    assert all(r.expiry is None or r.expiry.timestamp() * 1000 >= now for r in live)
    # the open reads left at EOF come first, lowest xid first: items 0, 1, 4, 5, 7, 8 were held
    heads = [bytes(r.data).split(b":")[1] for r in sorted(every, key=lambda r: r.position)[:6]]
    assert heads == [b"0", b"1", b"4", b"5", b"7", b"8"]


def test_records_mode_matches_the_engine_reader(spark, spool):
    path, now, _ = spool
    df = spark.read.format("lanner-journal").option("mode", "records").option("now", str(now)).load(path)
    assert df.columns == ["queue", "file", "offset", "op", "xid", "add_time", "expiry", "data", "spool"]
    # the files the server would replay: the pack stands for the archives it covers
    (pack,) = [n for n in os.listdir(path) if n.endswith(".pack")]
    pack_ts = int(pack.split(".")[1])
    files = [n for n in os.listdir(path) if not n.startswith("packed.") or n == pack
             or int(n.split(".")[1]) > pack_ts]
    assert len(files) < len(os.listdir(path))
    assert df.rdd.getNumPartitions() == len(files)                               # one per file
    rows = df.selectExpr("queue", "file", "offset", "op", "xid", "data",
                         "unix_millis(add_time) AS add_ms").collect()
    got = sorted((r.file, r.offset, r.op, r.xid, None if r.data is None else bytes(r.data), r.add_ms)
                 for r in rows)
    expect = []
    for fname in files:
        try:
            for off, rec in read_records(os.path.join(path, fname), now_ms=now):
                item = rec.item
                expect.append((fname, off, JR.OP_NAMES[rec.opcode],
                               rec.xid if rec.opcode in JR.XID_OPS else None,
                               None if item is None else bytes(item.data),
                               None if item is None else item.add_time))
        except JournalCorrupt:
            pass
    assert got == sorted(expect)
    ops = {r[2] for r in got}
    assert {"ADD", "ADDX", "REMOVE", "REMOVE_TENTATIVE", "SAVE_XID", "UNREMOVE", "CONFIRM_REMOVE",
            "ADD_XID", "CONTINUE", "REMOVE_TENTATIVE_XID"} <= ops
    assert {r.queue for r in rows} == set(QUEUES)


def test_several_spools_a_file_list_and_pruning(spark, tmp_path):
    clock = FakeClock(T0)
    spools = []
    for s in ("a", "b"):
        d = str(tmp_path / s)
        os.makedirs(d)
        for name, n in (("jobs", 3), ("mail", 2)):
            q = open_queue(d, name, clock)
            for i in range(n):
                q.add(payload(f"{s}-{name}", i, 20))
            close(q)
        spools.append(d)
    reader = spark.read.format("lanner-journal")
    rows = reader.load(spools).collect()                       # paths arrive as a JSON string
    assert sorted((r.spool, r.queue) for r in rows) == sorted(
        [(spools[0], "jobs")] * 3 + [(spools[0], "mail")] * 2 + [(spools[1], "jobs")] * 3 +
        [(spools[1], "mail")] * 2)
    assert reader.load([spools[0], spools[0]]).count() == 5    # the same spool twice is read once
    one = reader.load(os.path.join(spools[1], "mail")).collect()
    assert [bytes(r.data)[:8] for r in sorted(one, key=lambda r: r.position)] == [b"b-mail:0", b"b-mail:1"]
    pruned = reader.option("queues", "mail").load(spools)
    assert pruned.rdd.getNumPartitions() == 2                  # one per (spool, queue); jobs never planned
    assert {r.queue for r in pruned.collect()} == {"mail"}
    os.makedirs(str(tmp_path / "empty"))
    assert reader.load(str(tmp_path / "empty")).count() == 0
    assert spark.read.format("lanner-cmdlog").load(str(tmp_path / "empty")).count() == 0
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW j USING `lanner-journal` OPTIONS (path '{spools[0]}')")
    assert spark.sql("SELECT queue, count(*) AS n FROM j GROUP BY queue ORDER BY queue").collect() == \
        [("jobs", 3), ("mail", 2)]


def test_schema_and_bad_options(spark, spool):
    path, _, _ = spool
    df = spark.read.format("lanner-journal").load(path)
    assert [f.name for f in df.schema.fields] == ["queue", "position", "add_time", "expiry", "data", "spool"]
    assert [f.dataType.simpleString() for f in df.schema.fields] == \
        ["string", "bigint", "timestamp", "timestamp", "binary", "string"]
    with pytest.raises(Exception, match="mode must be"):
        spark.read.format("lanner-journal").option("mode", "ops").load(path).collect()
    with pytest.raises(Exception, match="no such file"):
        spark.read.format("lanner-journal").load(path + "/nope").collect()


# -- planning and re-reads, without Spark's machinery ------------------------------------------

def _reader(schema, **options):
    return JournalReader(options, schema)


def _rows(reader, part):
    out = []
    for rb in reader.read(part):
        out.extend(zip(*(c.to_pylist() for c in rb.columns)))
    return out


def test_a_rerun_reads_the_planned_bytes_while_the_server_appends_and_rotates(tmp_path):
    spool = str(tmp_path)
    clock = FakeClock(T0)
    q = open_queue(spool, "q", clock)
    for i in range(5):
        q.add(payload("q", i, 30))
    q.storage.flush()
    reader = _reader(ITEMS_SCHEMA, path=spool)
    (part,) = reader.partitions()
    first = _rows(reader, part)
    assert len(first) == 5
    for i in range(5, 9):                              # the server appends after planning
        q.add(payload("q", i, 30))
    q.remove()
    q.storage.flush()
    assert _rows(reader, part) == first
    os.rename(os.path.join(spool, "q"), os.path.join(spool, "q.1700000000001"))   # a rotation
    with open(os.path.join(spool, "q"), "wb") as f:
        f.write(b"\x01")
    assert _rows(reader, part) == first                # followed by inode
    os.unlink(os.path.join(spool, "q.1700000000001"))  # packed away
    with pytest.raises(JR.JournalChanged, match="run the query again"):
        _rows(reader, part)
    close(q)


def test_replay_order_finishes_packs_without_touching_files():
    entries = [(100, False, "q.100"), (200, True, "q.200.pack"), (300, False, "q.300"),
               (200, False, "q.200"), (400, True, "q.400.pack"), (500, False, "q.500")]
    assert JR.replay_order(entries) == ["q.400.pack", "q.500"]
    assert JR.replay_order([(99, False, "q.99"), (100, False, "q.100")]) == ["q.99", "q.100"]
    assert JR.replay_order([(5, True, "q.5.pack"), (7, False, "q.7")]) == ["q.5.pack", "q.7"]


def test_option_paths():
    assert JR.option_paths({"path": "/a"}) == ["/a"]
    assert JR.option_paths({"paths": json.dumps(["/a", "/b"])}) == ["/a", "/b"]
    with pytest.raises(ValueError):
        JR.option_paths({})
