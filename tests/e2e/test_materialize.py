"""The materializer against real Kafka, real Spark and Delta, with PostgreSQL as the oracle.

The state-mode test applies a workload to a real PostgreSQL table and, for each statement,
produces the records pgrouter would send (``TableEncoder`` fed with PostgreSQL's own text forms
of the rows), plus duplicates and late older records; after each micro-batch run the Delta
table must equal the PostgreSQL table. The changelog tests check that every position is held
exactly once after a re-run batch and after a hard kill of ``pgrouter materialize``.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from decimal import Decimal

import psycopg2
import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from router.formats.envelope import TableEncoder, TxContext
from router.pgoutput import UNCHANGED_TOAST, Relation, RelationColumn
from router.formats.schema import encode_schema

pytestmark = [pytest.mark.services, pytest.mark.spark]

ROOT = pathlib.Path(__file__).resolve().parents[2]
NUMERIC_12_2 = (12 << 16 | 2) + 4


class Feed:
    """Produces pgrouter records to one data topic (2 partitions) and a schema topic."""

    def __init__(self, bootstrap: str, tag: str):
        self.topic, self.schema_topic = f"mz.{tag}", f"mz.schemas.{tag}"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic(self.topic, 2, 1), NewTopic(self.schema_topic, 1, 1)])
        admin.close()
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        self.commit_lsn = 0x1000000
        self.sent: list[tuple[bytes, bytes]] = []

    def schema(self, enc: TableEncoder) -> None:
        k, v = encode_schema(enc.schema)
        self.producer.send(self.schema_topic, key=k, value=v).get(timeout=30)

    def tx(self) -> TxContext:
        self.commit_lsn += 0x1000
        return TxContext(xid=self.commit_lsn // 0x1000, commit_lsn=self.commit_lsn,
                         end_lsn=self.commit_lsn + 1, commit_time=789_000_000_000_000)

    def send(self, kv: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
        self.producer.send(self.topic, key=kv[0], value=kv[1])
        self.sent.append(kv)
        return kv

    def flush(self) -> None:
        self.producer.flush(timeout=30)


def _config(tmp: pathlib.Path, bootstrap: str, feed: Feed, mode: str, **extra):
    from actors.materialize import job

    return job.JobConfig(bootstrap_servers=bootstrap, topics=[feed.topic],
                         schema_topic=feed.schema_topic, warehouse=str(tmp / "wh"),
                         checkpoint=str(tmp / "ck"), mode=mode, **extra)


# --- state mode, PostgreSQL as the oracle ----------------------------------------------------

COLS = ("id int4 PRIMARY KEY, name text, amount numeric(12,2), big numeric, f float8, ok bool, "
        "d date, ts timestamp, tstz timestamptz, raw bytea, tags int4[], doc jsonb, note text")
SELECT = ("SELECT id::text, name, amount::text, big::text, f::text, "
          "CASE WHEN ok THEN 't' WHEN NOT ok THEN 'f' END, d::text, ts::text, tstz::text, "
          "raw::text, tags::text, doc::text, note{extra} FROM {t} WHERE id = %s")


def _relation(table: str, extra: bool) -> Relation:
    cols = [RelationColumn(1, "id", 23, -1), RelationColumn(0, "name", 25, -1),
            RelationColumn(0, "amount", 1700, NUMERIC_12_2), RelationColumn(0, "big", 1700, -1),
            RelationColumn(0, "f", 701, -1), RelationColumn(0, "ok", 16, -1),
            RelationColumn(0, "d", 1082, -1), RelationColumn(0, "ts", 1114, -1),
            RelationColumn(0, "tstz", 1184, -1), RelationColumn(0, "raw", 17, -1),
            RelationColumn(0, "tags", 1007, -1), RelationColumn(0, "doc", 3802, -1),
            RelationColumn(0, "note", 25, -1)]
    if extra:
        cols.append(RelationColumn(0, "extra", 20, -1))
    return Relation(77, "public", table, "d", tuple(cols))


class Oracle:
    """Runs each statement on PostgreSQL and sends the records pgrouter would send for it."""

    def __init__(self, dsn: str, feed: Feed, table: str):
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.cur = self.conn.cursor()
        self.cur.execute("SET TimeZone = 'UTC'")
        self.feed, self.table, self.extra = feed, table, False
        self.cur.execute(f"DROP TABLE IF EXISTS {table}; CREATE TABLE {table} ({COLS})")
        self.enc = TableEncoder(_relation(table, False), route="orders", db="postgres")
        feed.schema(self.enc)

    def add_column(self) -> None:
        self.cur.execute(f"ALTER TABLE {self.table} ADD COLUMN extra int8")
        self.extra = True
        self.enc = TableEncoder(_relation(self.table, True), route="orders", db="postgres")
        self.feed.schema(self.enc)

    def row(self, id_: int) -> tuple:
        self.cur.execute(SELECT.format(t=self.table, extra=", extra::text" if self.extra else ""),
                         (id_,))
        return self.cur.fetchone()

    def key(self, id_: int) -> tuple:
        return (str(id_),) + (None,) * (len(self.enc.relation.columns) - 1)

    def insert(self, tx, seq, values: dict):
        names = ", ".join(values)
        self.cur.execute(f"INSERT INTO {self.table} ({names}) VALUES "
                         f"({', '.join(['%s'] * len(values))})", tuple(values.values()))
        new = self.row(values["id"])
        return self.feed.send(self.enc.encode("c", tx, tx.commit_lsn - 0x100 + seq, seq,
                                              old=None, old_is_key=False, new=new))

    def update(self, tx, seq, id_: int, sets: dict, *, toast: tuple[str, ...] = ()):
        self.cur.execute(f"UPDATE {self.table} SET {', '.join(f'{k} = %s' for k in sets)} "
                         f"WHERE id = %s", (*sets.values(), id_))
        new_id = sets.get("id", id_)
        new = list(self.row(new_id))
        names = [c.name for c in self.enc.relation.columns]
        for c in toast:
            new[names.index(c)] = UNCHANGED_TOAST
        old = self.key(id_) if new_id != id_ else None
        return self.feed.send(self.enc.encode("u", tx, tx.commit_lsn - 0x100 + seq, seq, old=old,
                                              old_is_key=True, new=tuple(new)))

    def delete(self, tx, seq, id_: int):
        self.cur.execute(f"DELETE FROM {self.table} WHERE id = %s", (id_,))
        return self.feed.send(self.enc.encode("d", tx, tx.commit_lsn - 0x100 + seq, seq,
                                              old=self.key(id_), old_is_key=True, new=None))

    def truncate(self, tx, seq):
        self.cur.execute(f"TRUNCATE {self.table}")
        return self.feed.send(self.enc.encode_truncate(tx, tx.commit_lsn - 0x100 + seq, seq, 0))

    def rows(self) -> list[tuple]:
        self.cur.execute(f"SELECT id, name, amount, big, f, ok, d, ts, tstz, raw, tags, doc, note"
                         f"{', extra' if self.extra else ''} FROM {self.table} ORDER BY id")
        return [_norm(r) for r in self.cur.fetchall()]


def _norm(r) -> tuple:
    """A row from either side in one comparable shape."""
    (id_, name, amount, big, f, ok, d, ts, tstz, raw, tags, doc, note, *extra) = r
    return (id_, name, amount, None if big is None else Decimal(big),
            "nan" if isinstance(f, float) and math.isnan(f) else f, ok, d, ts,
            None if tstz is None else round(tstz.timestamp(), 6),
            None if raw is None else bytes(raw), tags,
            json.loads(doc) if isinstance(doc, str) else doc, note, *(extra or [None]))


def _delta_rows(spark, path: str, extra: bool) -> list[tuple]:
    df = spark.read.format("delta").load(path).filter("NOT _pgr_deleted").orderBy("id")
    cols = ["id", "name", "amount", "big", "f", "ok", "d", "ts", "tstz", "raw", "tags", "doc",
            "note"] + (["extra"] if extra else [])
    return [_norm(tuple(r)) for r in df.select(*cols).collect()]


def test_state_matches_postgres(spark, pg_dsn, kafka_bootstrap, tmp_path):
    from actors.materialize import job

    tag = uuid.uuid4().hex[:8]
    feed = Feed(kafka_bootstrap, tag)
    pg = Oracle(pg_dsn, feed, f"mz_orders_{tag}")
    cfg = _config(tmp_path, kafka_bootstrap, feed, "state")
    path = f"{cfg.warehouse}/orders/public/{pg.table}"
    long_note = "toast me " * 400

    def run_and_compare():
        feed.flush()
        job.Materializer(spark, cfg).run(available_now=True)
        assert _delta_rows(spark, path, pg.extra) == pg.rows()

    # batch 1: inserts of every type, updates, unchanged TOAST, delete, key change, duplicates
    tx = feed.tx()
    first = {}
    for i in range(1, 9):
        first[i] = pg.insert(tx, i, {
            "id": i, "name": f"n{i} ü" if i % 3 else None, "amount": Decimal(f"{i}.5{i}"),
            "big": "123456789012345678901234567890.000000000000000000001" if i == 1 else i,
            "f": ["NaN", "Infinity", "-Infinity", 1.5, -0.25, None, 1e300, 3][i - 1],
            "ok": [True, False, None][i % 3], "d": f"2024-01-0{i}",
            "ts": f"2024-01-02 03:04:0{i}.12345{i}", "tstz": f"2024-01-02 03:04:05.5+0{i}:30",
            "raw": bytes([0, i, 255]), "tags": [i, None, -i] if i % 2 else [],
            "doc": json.dumps({"k": i, "s": "x\"y"}), "note": long_note + str(i)})
    tx = feed.tx()
    upd1 = pg.update(tx, 0, 1, {"name": "renamed"})
    pg.update(tx, 1, 2, {"amount": Decimal("99.99")}, toast=("note",))
    tx = feed.tx()
    pg.delete(tx, 0, 3)
    pg.update(tx, 1, 4, {"id": 104, "name": "moved"}, toast=("note",))  # TOAST of the old key
    feed.send(first[5])  # duplicates, byte-identical
    feed.send(upd1)
    run_and_compare()
    # a key change with unchanged TOAST in the first batch: created empty, then written
    from delta.tables import DeltaTable
    history = DeltaTable.forPath(spark, path).history().collect()
    assert [h.operation for h in reversed(history)] == ["CREATE TABLE", "WRITE"]
    assert DeltaTable.forPath(spark, path).detail().collect()[0].properties["pgrouter.key"] == '["id"]'

    # batch 2: late older records, TOAST against the stored value, an added column
    feed.send(first[3])  # older than the delete of 3: must not resurrect it
    feed.send(first[1])  # older than the rename of 1: must not overwrite it
    feed.send(first[4])  # older than the key change
    tx = feed.tx()
    pg.update(tx, 0, 2, {"name": "toast kept"}, toast=("note", "doc"))
    ins9 = pg.insert(tx, 1, {"id": 9, "name": "nine", "note": "short"})
    pg.add_column()
    tx = feed.tx()
    pg.update(tx, 0, 5, {"extra": 42})
    pg.update(tx, 2, 7, {"id": 107}, toast=("note", "doc"))  # the old key's stored TOAST
    pg.insert(tx, 1, {"id": 11, "name": "eleven", "extra": -7})
    run_and_compare()

    # batch 3: truncate, then changes after it in the same batch; late records from before it
    tx = feed.tx()
    pg.truncate(tx, 0)
    tx = feed.tx()
    ins20 = pg.insert(tx, 0, {"id": 20, "name": "after truncate", "note": long_note, "extra": 1})
    pg.insert(tx, 1, {"id": 21, "name": "twenty-one"})
    tx = feed.tx()
    pg.update(tx, 0, 20, {"name": "after truncate, updated"}, toast=("note",))
    feed.send(ins9)
    feed.send(ins20)
    feed.send(first[6])
    run_and_compare()
    assert len(pg.rows()) == 2

    # a re-run with the same checkpoint finds nothing new and changes nothing
    before = spark.read.format("delta").load(path).count()
    run_and_compare()
    assert spark.read.format("delta").load(path).count() == before


def test_state_refuses_keyless_table(spark, kafka_bootstrap, tmp_path):
    from actors.materialize import job

    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    rel = Relation(5, "public", "nokey", "f", (RelationColumn(0, "a", 23, -1),))
    enc = TableEncoder(rel, route="r", db="postgres")
    feed.schema(enc)
    feed.send(enc.encode("c", feed.tx(), 1, 0, old=None, old_is_key=False, new=("1",)))
    feed.flush()
    with pytest.raises(job.MaterializeError, match="no key columns"):
        job.Materializer(spark, _config(tmp_path, kafka_bootstrap, feed, "state")).run(
            available_now=True)


@pytest.mark.parametrize("spoil", ["not JSON", "an integer column's value as a string"])
def test_a_record_that_is_not_a_change_record_stops_the_batch(spark, kafka_bootstrap, tmp_path,
                                                              spoil):
    """Neither skipped (a lost change) nor half read (a wrong row): the job stops naming the
    record's Kafka position, and nothing of its batch is written."""
    from actors.materialize import job

    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    rel = Relation(5, "public", "spoiled", "d", (RelationColumn(1, "id", 23, -1),
                                                 RelationColumn(0, "n", 20, -1)))
    enc = TableEncoder(rel, route="r", db="postgres")
    feed.schema(enc)
    good = enc.encode("c", feed.tx(), 1, 0, old=None, old_is_key=False, new=("1", "10"))
    feed.send(good)
    assert b'"n":10' in good[1]
    value = b"{not json" if spoil == "not JSON" else good[1].replace(b'"n":10', b'"n":"10"')
    at = feed.producer.send(feed.topic, key=good[0], value=value).get(timeout=30)
    feed.send(enc.encode("c", feed.tx(), 1, 0, old=None, old_is_key=False, new=("2", "20")))
    feed.flush()
    cfg = _config(tmp_path, kafka_bootstrap, feed, "state")
    with pytest.raises(job.MaterializeError) as err:
        job.Materializer(spark, cfg).run(available_now=True)
    assert (f"record at {feed.topic} partition {at.partition} offset {at.offset} is not a "
            "pgrouter change record") in str(err.value)
    assert value.decode()[:9] in str(err.value)
    assert not os.path.exists(f"{cfg.warehouse}/r/public/spoiled")


def test_schema_topic_read_to_its_end_by_the_driver(spark, kafka_bootstrap, tmp_path):
    """Every partition from its beginning to its end, records without a value skipped; a schema
    topic that does not exist reads as empty and is not created; the job's [kafka] options
    apply (SSL against a plaintext broker: a clear error, not a hang)."""
    from actors.materialize import job
    from actors.materialize.schema_topic import read_schema_topic

    topic = f"mz.schemas.{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(topic, 3, 1)])
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    sent = []
    for i in range(700):  # more than one fetch's worth per partition
        value = None if i % 97 == 0 else json.dumps({"schema_id": f"s{i}", "pad": "x" * 900})
        producer.send(topic, key=f"k{i}".encode(), value=value and value.encode())
        sent += [value.encode()] if value else []
    producer.flush(timeout=30)
    cfg = job.JobConfig(bootstrap_servers=kafka_bootstrap, topics=["unused"], schema_topic=topic,
                        warehouse=str(tmp_path / "wh"), checkpoint=str(tmp_path / "ck"))
    read = read_schema_topic(spark, cfg)
    assert sorted(read) == sorted(sent) and len(read) == 700 - 8

    missing = f"mz.schemas.missing.{uuid.uuid4().hex[:8]}"
    assert read_schema_topic(spark, job.JobConfig(**{**cfg.__dict__, "schema_topic": missing})) == []
    time.sleep(2)  # a broker creates a topic asked for asynchronously
    assert missing not in admin.list_topics()
    admin.close()

    ssl = job.JobConfig(**{**cfg.__dict__, "kafka_options": {"kafka.security.protocol": "SSL"}})
    with pytest.raises(job.MaterializeError, match=f"schema topic '{topic}' on "):
        read_schema_topic(spark, ssl, timeout_s=3)


def test_a_schema_topic_that_cannot_be_read_stops_the_job_with_its_reason(spark, kafka_bootstrap,
                                                                         tmp_path):
    """The read before the first batch fails (a Kafka option the client refuses): the job ends
    with the schema topic's own one-line reason, not wrapped as a failed query."""
    from actors.materialize import job

    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    cfg = _config(tmp_path, kafka_bootstrap, feed, "state",
                  kafka_options={"kafka.security.protocol": "BOGUS"})
    with pytest.raises(job.MaterializeError) as err:
        job.Materializer(spark, cfg).run(available_now=True)
    assert str(err.value).startswith(f"schema topic '{feed.schema_topic}': cannot create a Kafka "
                                     "consumer: ConfigException: ")


def test_a_schema_missing_from_the_schema_topic_stops_the_job(spark, kafka_bootstrap, tmp_path):
    from actors.materialize import job

    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    enc = TableEncoder(Relation(5, "public", "unknown", "d", (RelationColumn(1, "id", 23, -1),)),
                       route="r", db="postgres")
    feed.send(enc.encode("c", feed.tx(), 1, 0, old=None, old_is_key=False, new=("1",)))
    feed.flush()
    cfg = _config(tmp_path, kafka_bootstrap, feed, "state")
    with pytest.raises(job.MaterializeError,
                       match=f"schema {enc.schema.schema_id} is not in the schema topic "
                             f"'{feed.schema_topic}'"):
        job.Materializer(spark, cfg).run(available_now=True)
    assert not os.path.exists(f"{cfg.warehouse}/r/public/unknown")


def test_a_value_the_job_cannot_store_stops_it_with_a_clear_error(spark, kafka_bootstrap,
                                                                   tmp_path):
    """A two-dimensional array in an int4[] column (valid PostgreSQL; array columns are
    one-dimensional Spark arrays): the job stops naming the table, the column and the value,
    writes nothing of the batch, and reports it as a MaterializeError (one line at the CLI),
    not a Python worker's traceback."""
    from actors.materialize import job

    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    rel = Relation(5, "public", "grid", "d", (RelationColumn(1, "id", 23, -1),
                                              RelationColumn(0, "a", 1007, -1)))
    enc = TableEncoder(rel, route="r", db="postgres")
    feed.schema(enc)
    feed.send(enc.encode("c", feed.tx(), 1, 0, old=None, old_is_key=False, new=("1", "{1,2}")))
    feed.send(enc.encode("c", feed.tx(), 1, 0, old=None, old_is_key=False,
                         new=("2", "{{1,2},{3,4}}")))
    feed.flush()
    cfg = _config(tmp_path, kafka_bootstrap, feed, "state")
    with pytest.raises(job.MaterializeError) as err:
        job.Materializer(spark, cfg).run(available_now=True)
    assert str(err.value).startswith("public.grid: ValueError: column 'a': multi-dimensional "
                                     "arrays are not supported: '{{1,2},{3,4}}'")
    assert "\n" not in str(err.value)
    from delta.tables import DeltaTable  # nothing committed (a failed write may leave files)
    assert not DeltaTable.isDeltaTable(spark, f"{cfg.warehouse}/r/public/grid")


def test_incompatible_type_change_stops(spark, kafka_bootstrap, tmp_path):
    from actors.materialize import job

    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    cfg = _config(tmp_path, kafka_bootstrap, feed, "state")
    for oid, value in ((23, "1"), (25, "one")):
        rel = Relation(6, "public", "t", "d", (RelationColumn(1, "id", 23, -1),
                                               RelationColumn(0, "v", oid, -1)))
        enc = TableEncoder(rel, route="r", db="postgres")
        feed.schema(enc)
        feed.send(enc.encode("c", feed.tx(), 1, 0, old=None, old_is_key=False, new=("1", value)))
        feed.flush()
        if oid == 23:
            job.Materializer(spark, cfg).run(available_now=True)
            # created by its first write: rows and key property in one commit
            from delta.tables import DeltaTable
            dt = DeltaTable.forPath(spark, f"{cfg.warehouse}/r/public/t")
            assert [h.operation for h in dt.history().collect()] == ["CREATE TABLE AS SELECT"]
            assert dt.detail().collect()[0].properties["pgrouter.key"] == '["id"]'
            assert dt.toDF().count() == 1
    with pytest.raises(job.MaterializeError, match="incompatible type change"):
        job.Materializer(spark, cfg).run(available_now=True)


# --- changelog mode: each position exactly once ------------------------------------------------


def _changelog_workload(feed: Feed, n_tx: int, per_tx: int) -> set[tuple[int, int]]:
    rel = Relation(9, "public", "events", "d", (RelationColumn(1, "id", 20, -1),
                                                RelationColumn(0, "v", 25, -1)))
    enc = TableEncoder(rel, route="log", db="postgres")
    feed.schema(enc)
    positions = set()
    for _ in range(n_tx):
        tx = feed.tx()
        for seq in range(per_tx):
            k = (tx.commit_lsn + seq) % 500
            op = "c" if seq % 3 == 0 else ("u" if seq % 3 == 1 else "d")
            new = None if op == "d" else (str(k), f"v{tx.xid}.{seq}")
            kv = feed.send(enc.encode(op, tx, tx.commit_lsn + seq, seq,
                                      old=(str(k), None) if op == "d" else None,
                                      old_is_key=True, new=new))
            positions.add((tx.commit_lsn, seq))
            if seq % 17 == 0:
                feed.send(kv)  # a duplicate, as after a router restart
    feed.flush()
    return positions


def _positions(spark, path: str) -> list[tuple[int, int]]:
    return [(r[0], r[1]) for r in
            spark.read.format("delta").load(path).select("_pgr_commit_lsn", "_pgr_seq").collect()]


def test_changelog_exactly_once_after_rerun(spark, kafka_bootstrap, tmp_path):
    from actors.materialize import job

    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    want = _changelog_workload(feed, 20, 50)
    cfg = _config(tmp_path, kafka_bootstrap, feed, "changelog", max_offsets_per_trigger=400)
    path = f"{cfg.warehouse}/log/public/events"
    job.Materializer(spark, cfg).run(available_now=True)
    got = _positions(spark, path)
    assert len(got) == len(set(got)) and set(got) == want

    # "killed after the Delta commit, before the checkpoint commit": forget the last two
    # batch commits, so Spark runs those batches again with the same ids
    commits = sorted((pathlib.Path(cfg.checkpoint) / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert len(commits) >= 3
    for p in commits[-2:]:
        p.unlink()
        pathlib.Path(p.parent, f".{p.name}.crc").unlink(missing_ok=True)
    want |= _changelog_workload(feed, 4, 50)
    job.Materializer(spark, cfg).run(available_now=True)
    got = _positions(spark, path)
    assert len(got) == len(set(got)) and set(got) == want
    ops = spark.read.format("delta").load(path).groupBy("_pgr_op").count().collect()
    assert {r[0] for r in ops} == {"c", "u", "d"}


def test_changelog_exactly_once_after_hard_kill(spark, kafka_bootstrap, tmp_path):
    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    want = _changelog_workload(feed, 60, 50)
    conf = tmp_path / "materialize.toml"
    template = f"""
[kafka]
bootstrap_servers = "{kafka_bootstrap}"
topics = ["{feed.topic}"]
schema_topic = "{feed.schema_topic}"
max_offsets_per_trigger = {{max_offsets}}
[spark]
master = "local[2]"
conf = {{ "spark.sql.shuffle.partitions" = "2" }}
[delta]
warehouse = "{tmp_path / 'wh'}"
checkpoint = "{tmp_path / 'ck'}"
mode = "changelog"
"""
    conf.write_text(template.replace("{max_offsets}", "300"))
    cmd = [sys.executable, "-m", "actors.cli", "materialize", "-c", str(conf),
           "--devstack-dir", str(ROOT / ".devstack")]
    log = open(tmp_path / "run1.log", "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    delta_log = tmp_path / "wh" / "log" / "public" / "events" / "_delta_log"
    deadline = time.monotonic() + 150
    try:
        while len(list(delta_log.glob("*.json"))) < 3:  # three batches written
            assert proc.poll() is None, (tmp_path / "run1.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "materializer made no progress"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the JVM is in the same new session
        proc.wait(timeout=30)
    # the batch planned but not committed is re-run as planned, the rest in one bigger batch
    conf.write_text(template.replace("{max_offsets}", "5000"))
    done = subprocess.run(cmd + ["--available-now"], cwd=ROOT, capture_output=True, timeout=240)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    got = _positions(spark, str(delta_log.parent))
    assert len(got) == len(set(got)) and set(got) == want


def test_class_archive_written_by_a_first_run_and_mapped_by_the_next(spark, kafka_bootstrap,
                                                                    tmp_path):
    """``[spark] class_archive``: the first ``pgrouter materialize`` run's JVM writes the archive
    when it exits; the next run's JVM maps it (HotSpot says so with -Xlog:cds=info)."""
    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    want = _changelog_workload(feed, 4, 25)
    conf = tmp_path / "materialize.toml"
    conf.write_text(f"""
[kafka]
bootstrap_servers = "{kafka_bootstrap}"
topics = ["{feed.topic}"]
schema_topic = "{feed.schema_topic}"
[spark]
master = "local[1]"
class_archive = "{tmp_path / 'classes'}"
[delta]
warehouse = "{tmp_path / 'wh'}"
checkpoint = "{tmp_path / 'ck'}"
mode = "changelog"
""")
    cmd = [sys.executable, "-m", "actors.cli", "materialize", "-c", str(conf), "--available-now",
           "--devstack-dir", str(ROOT / ".devstack")]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=240)
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    written = list((tmp_path / "classes").iterdir())
    assert [p.suffix for p in written] == [".jsa"], written  # renamed into place, no temporary
    assert written[0].stat().st_size > 50 << 20
    assert set(_positions(spark, str(tmp_path / "wh" / "log" / "public" / "events"))) == want

    want |= _changelog_workload(feed, 2, 25)
    env = {**os.environ, "JAVA_TOOL_OPTIONS": "-Xlog:cds=info"}
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=240, env=env)
    assert second.returncode == 0, second.stderr.decode()[-2000:]
    out = (second.stdout + second.stderr).decode()
    assert f"Opened archive {written[0]}" in out, out[-3000:]
    assert list((tmp_path / "classes").iterdir()) == written
    got = _positions(spark, str(tmp_path / "wh" / "log" / "public" / "events"))
    assert len(got) == len(set(got)) and set(got) == want


# --- the whole pipeline: PostgreSQL -> pgrouter run -> Kafka -> Spark -> Delta ------------------


_PIPELINE_COLS = ("id int primary key, name text, amount numeric(10,2), at timestamptz, "
                  "tags int[], note text, s smallint, o oid, b bool, f4 real, "
                  "f8 double precision, d date, u uuid, j jsonb, by bytea, ts timestamp")
_PIPELINE_SELECT = ("select id, name, amount, at, tags, note, extra, s, o, b, f4, f8, d, u::text, "
                    "j::text, by, ts from {t}")


def _pipeline_rows(rows) -> dict:
    """Rows of either side (dicts of the columns above) in one comparable shape."""
    def norm(v):
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v)
        return v
    out = {}
    for r in rows:
        r = dict(r)
        r["at"] = None if r["at"] is None else round(r["at"].timestamp(), 6)
        r["j"] = None if r["j"] is None else json.loads(r["j"])
        out[r["id"]] = {k: norm(v) for k, v in r.items()}
    return out


def test_pipeline_postgres_router_delta(spark, pg_dsn, kafka_bootstrap, tmp_path):
    """PostgreSQL -> ``pgrouter run`` -> Kafka -> the job -> Delta, compared with PostgreSQL
    after each of two incremental runs: many column types (integers and booleans parsed as
    JSON numbers, NaN floats, arrays, bytea, jsonb…), unchanged TOAST, key changes, a
    truncate, an added column."""
    from actors.materialize import job
    from tests.helpers import Pg, route_to_delta, run_router, unique

    pg = Pg(pg_dsn)
    name = unique("mzr")
    t = f"{name}_t"
    pg.run(f"create table {t} ({_PIPELINE_COLS})")
    pg.run(f"alter table {t} alter column note set storage external")  # TOAST without compression
    pg.run(f"create publication {name} for table {t}")
    cfg_path, cfg = route_to_delta(tmp_path, dsn=pg_dsn, bootstrap=kafka_bootstrap, name=name,
                                   table=t)
    path = f"{cfg.warehouse}/{name}/public/{t}"
    big = "x" * 5000
    values = ("i::smallint, (i * 1000)::oid, i % 2 = 0, "
              "case when i % 7 = 0 then 'NaN'::real else i / 4.0 end, "
              "case when i % 5 = 0 then '-Infinity'::float8 else i * 1.1 end, "
              "date '2024-02-29' + i, md5(i::text)::uuid, "
              "jsonb_build_object('i', i, 'q', 'a\"b'), decode(lpad(to_hex(i), 4, '0'), 'hex'), "
              "timestamp '2024-01-01 00:00:00.123456' + i * interval '1 hour'")

    def materialize_and_compare():
        run_router(cfg_path)
        job.Materializer(spark, cfg).run(available_now=True)
        got = _pipeline_rows(r.asDict() for r in spark.read.format("delta").load(path)
                             .filter("NOT _pgr_deleted").select(
                                 "id", "name", "amount", "at", "tags", "note", "extra", "s",
                                 "o", "b", "f4", "f8", "d", "u", "j", "by", "ts").collect())
        cur = pg.conn.cursor()
        cur.execute(_PIPELINE_SELECT.format(t=t))
        names = [c.name for c in cur.description]
        want = _pipeline_rows(dict(zip(names, r)) for r in cur.fetchall())
        assert set(got) == set(want)
        for id_ in want:
            assert got[id_] == want[id_], id_

    try:
        pg.run(f"select pg_create_logical_replication_slot('{name}', 'pgoutput')")
        pg.run(f"insert into {t} select i, 'n' || i, i * 1.25, '2024-01-02 03:04:05+02', "
               f"array[i, null], '{big}' || i, {values} from generate_series(1, 40) i")
        pg.run(f"update {t} set name = 'toast kept' where id <= 10")  # note: unchanged TOAST
        pg.run(f"delete from {t} where id between 11 and 15")
        pg.run(f"update {t} set id = id + 1000 where id between 16 and 18")  # key change
        pg.run(f"truncate {t}")
        pg.run(f"insert into {t} select i, 'after', i, now(), '{{}}', '{big}', {values} from "
               f"generate_series(100, 120) i")
        pg.run(f"alter table {t} add column extra bigint")
        pg.run(f"update {t} set extra = id * 2, name = 'toast again' where id < 110")
        materialize_and_compare()

        # the second run: changes against the stored rows, NULLs, a key change, deletes
        pg.run(f"update {t} set b = null, s = -s, o = 4294967295, f4 = 'Infinity', "
               f"j = '[1, {{\"x\": null}}]', extra = -1 where id between 100 and 105")
        pg.run(f"update {t} set id = id + 500, name = 'moved' where id in (106, 107)")
        pg.run(f"delete from {t} where id in (108, 120)")
        pg.run(f"insert into {t} (id, name, s, b) values (130, 'late', 32767, true)")
        pg.run(f"update {t} set note = note || '!' where id = 109")  # TOAST changed
        materialize_and_compare()
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication if exists {name}")


def test_pipeline_text_form_types_and_a_composite_key(spark, pg_dsn, kafka_bootstrap,
                                                      tmp_path):
    """Through the real router: the types the materializer keeps as PostgreSQL's text form
    (interval, time, timetz, money, inet, cidr, macaddr, bit, varbit, json, char(n),
    varchar, an enum, a domain, a composite, unconstrained numeric with NaN), text[] with
    quotes, commas, braces, backslashes and NULLs, the values with no Spark equivalent (NULL:
    ±infinity, NaN in numeric(p,s)), bigint/float8 extremes, and a two-column key that
    changes, compared with PostgreSQL."""
    from actors.materialize import job
    from tests.helpers import Pg, route_to_delta, run_router, unique

    pg = Pg(pg_dsn)
    name = unique("mzt")
    t, mood, dom, pair = f"{name}_t", f"{name}_mood", f"{name}_pos", f"{name}_pair"
    pg.run(f"create type {mood} as enum ('sad', 'ok', 'happy')")
    pg.run(f"create domain {dom} as int check (value >= 0)")
    pg.run(f"create type {pair} as (a int, b text)")
    texts = ("iv interval, tm time, ttz timetz, mo money, ip inet, net cidr, mac macaddr, "
             f"bt bit(4), vb varbit, js json, ch char(5), vc varchar(10), en {mood}, "
             f"dm {dom}, cp {pair}, nu numeric")
    pg.run(f"create table {t} (k1 int, k2 text, {texts}, tx text[], nd numeric(10,2), "
           "tsi timestamptz, di date, i8 bigint, f8 float8, primary key (k1, k2))")
    pg.run(f"create publication {name} for table {t}")
    cfg_path, cfg = route_to_delta(tmp_path, dsn=pg_dsn, bootstrap=kafka_bootstrap, name=name,
                                   table=t)
    text_cols = [c.split()[0] for c in texts.split(", ")]
    try:
        pg.run(f"select pg_create_logical_replication_slot('{name}', 'pgoutput')")
        pg.run(f"""insert into {t} values
            (1, 'a', '1 day 02:03:04.5', '23:59:59.999999', '10:00+05:30', 12.5, '10.0.0.1/24',
             '10.0.0.0/8', '08:00:2b:01:02:03', B'1010', B'10', '{{"k": [1, null], "é": 1}}', 'ab', 'hello', 'happy', 7, '(1,"x, y")', 'NaN',
             array['plain', 'with "quotes"', 'comma,here', '{{braces}}', 'back\\slash', null,
                   'NULL', ''],
             'NaN', 'infinity', '-infinity', 9223372036854775807, 1.7976931348623157e308),
            (2, 'b', '-3 mons', '00:00', '00:00:00-08', -0.01, '::1', '2001:db8::/32',
             'ff:ff:ff:ff:ff:ff', B'0000', B'', 'null', '', '', 'sad', 0, '(,)',
             '-1e-30', '{{}}', 123.45, '2024-02-29 12:00:00+00', '2024-02-29',
             -9223372036854775808, -4.9e-324),
            (3, 'c😀', null, null, null, null, null, null, null, null, null, null, null, null,
             null, null, null, null, null, null, null, null, null, null)""")
        pg.run(f"update {t} set k2 = 'moved', vc = 'changed' where k1 = 2")  # key change
        pg.run(f"update {t} set en = 'ok', nu = 1e-3 where k1 = 1")
        run_router(cfg_path)
        job.Materializer(spark, cfg).run(available_now=True)

        cols = ["k1", "k2", *text_cols, "tx", "nd", "tsi", "di", "i8", "f8"]
        got = {(r.k1, r.k2): r.asDict() for r in spark.read.format("delta")
               .load(f"{cfg.warehouse}/{name}/public/{t}").filter("NOT _pgr_deleted")
               .select(*cols).collect()}
        raw = ("ch", "ip", "dm")  # output function's text (inet::text adds the mask), an int
        pg_cols = ", ".join(
            [c if c in raw else f"{c}::text" for c in ["k1", "k2", *text_cols]]
            + ["tx", "case when nd <> 'NaN' then nd end",
               "case when isfinite(tsi) then tsi end", "case when isfinite(di) then di end",
               "i8", "f8"])
        want = {}
        for row in pg.run(f"select {pg_cols} from {t}"):
            w = dict(zip(cols, row))
            w["k1"] = int(w["k1"])
            want[(w["k1"], w["k2"])] = w
        assert set(got) == set(want) == {(1, "a"), (2, "moved"), (3, "c😀")}
        for key, w in want.items():
            g = dict(got[key])
            for side in (g, w):
                side["tsi"] = side["tsi"] and round(side["tsi"].timestamp(), 6)
            assert g == w, key
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication if exists {name}")
        pg.run(f"drop table if exists {t}")
        pg.run(f"drop type if exists {pair}; drop domain if exists {dom}; "
               f"drop type if exists {mood}")
