"""``[output] format = "iceberg"``: PostgreSQL -> ``pgrouter run`` -> Kafka -> the job ->
Iceberg tables in a JDBC catalog kept in PostgreSQL, written merge-on-read, read back by an
independent reader (pyiceberg's ``SqlCatalog`` over the same catalog database, not Spark) and
compared with PostgreSQL's own SELECT after committed batches and after compaction."""

from __future__ import annotations

import datetime as dt
import decimal
import pathlib

import pytest

pytestmark = [pytest.mark.services, pytest.mark.spark]

COLS = "id, n, s, amt, at, b, f, d"


def _pg_rows(pg, t: str) -> dict:
    return {r[0]: tuple(r[1:]) for r in pg.run(f"select {COLS} from {t}")}


def _iceberg_rows(catalog, ident: tuple, columns: str = COLS) -> dict:
    """The live rows as pyiceberg reads them (delete files applied by pyiceberg itself)."""
    table = catalog.load_table(ident)
    rows = table.scan(row_filter="_pgr_deleted == False").to_arrow().to_pylist()
    names = [c.strip() for c in columns.split(",")]
    return {r["id"]: tuple(r[c] for c in names[1:]) for r in rows}


def _delete_files(catalog, ident: tuple) -> int:
    table = catalog.load_table(ident)
    return sum(1 for task in table.scan().plan_files() for _ in task.delete_files)


def test_iceberg_tables_equal_postgres_through_pyiceberg(spark, pg_dsn, kafka_bootstrap,
                                                        tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    from actors.materialize import job
    from tests.helpers import Pg, route_to_delta, run_router, unique

    pg = Pg(pg_dsn)
    name = unique("mzi")
    t = f"{name}_t"
    pg.run(f"create database {name}")  # the Iceberg catalog's own database
    host, port = pg.conn.info.host, pg.conn.info.port
    router_cfg, cfg = route_to_delta(tmp_path, dsn=pg_dsn, bootstrap=kafka_bootstrap,
                                     name=name, table=t)
    cfg.output_format, cfg.iceberg_catalog, cfg.iceberg_name = "iceberg", "jdbc", name
    cfg.iceberg_uri = f"jdbc:postgresql://{host}:{port}/{name}"
    cfg.iceberg_user, cfg.iceberg_warehouse = pg.conn.info.user, str(tmp_path / "wh")
    cfg.compact_interval = None  # compaction below, called as the schedule would
    ident = (name, "public", t)
    catalog = None
    try:
        pg.run(f"create table {t} (id int primary key, n int, s text, amt numeric(10,2), "
               f"at timestamptz, b bool, f float8, d date)")
        pg.run(f"create publication {name} for table {t}")
        pg.run(f"select pg_create_logical_replication_slot('{name}', 'pgoutput')")
        running = job.Materializer(spark, cfg)
        pg.run(f"insert into {t} select i, i * 10, 's' || i, i * 1.25, "
               f"timestamptz '2024-03-01 12:00:00.123456+02' + i * interval '1 day', i % 2 = 0, "
               f"i / 8.0, date '2024-02-28' + i from generate_series(1, 30) i")
        pg.run(f"insert into {t} (id) values (31)")  # NULLs in every other column
        run_router(router_cfg)
        running.run(available_now=True)
        catalog = SqlCatalog(name, uri=f"postgresql+psycopg2://{pg.conn.info.user}@{host}:"
                             f"{port}/{name}", warehouse=f"file://{tmp_path / 'wh'}")
        assert _iceberg_rows(catalog, ident) == _pg_rows(pg, t)
        props = catalog.load_table(ident).properties
        assert props["write.merge.mode"] == props["write.delete.mode"] == "merge-on-read"
        assert props["write.merge.distribution-mode"] == "none"

        # updates, a key change, deletes, a schema change (int widened, a column added)
        pg.run(f"update {t} set s = null, amt = -amt, b = not b where id <= 5")
        pg.run(f"update {t} set id = id + 100 where id in (6, 7)")
        pg.run(f"delete from {t} where id between 10 and 12")
        pg.run(f"alter table {t} alter column n type bigint")
        pg.run(f"alter table {t} add column extra text")
        pg.run(f"update {t} set n = 5000000000 + id, extra = 'x' || id where id between 20 and 22")
        run_router(router_cfg)
        running.run(available_now=True)
        cols = COLS + ", extra"
        want = {r[0]: tuple(r[1:]) for r in pg.run(f"select {cols} from {t}")}
        assert _iceberg_rows(catalog, ident, cols) == want
        assert _delete_files(catalog, ident) > 0  # merge-on-read: position deletes
        types = {f.name: str(f.field_type) for f in catalog.load_table(ident).schema().fields}
        assert (types["n"], types["extra"], types["amt"]) == ("long", "string", "decimal(10, 2)")
        row = want[1]
        assert row[2] == decimal.Decimal("-1.25") and row[3] == dt.datetime(
            2024, 3, 2, 10, 0, 0, 123456, tzinfo=dt.timezone.utc)

        # TRUNCATE, then rows after it
        pg.run(f"truncate {t}")
        pg.run(f"insert into {t} (id, n, s) values (1, 1, 'after'), (2, null, 'after')")
        run_router(router_cfg)
        running.run(available_now=True)
        want = {r[0]: tuple(r[1:]) for r in pg.run(f"select {cols} from {t}")}
        assert _iceberg_rows(catalog, ident, cols) == want
        table = catalog.load_table(ident)
        assert table.properties["pgrouter.truncated_before"]
        summary = table.current_snapshot().summary
        assert summary["pgrouter.app-id"] == running.app_id and summary["pgrouter.batch-id"]

        # a batch re-run after its Iceberg commit (the checkpoint lost it) commits nothing
        snapshots = len(table.snapshots())
        commits = sorted((pathlib.Path(cfg.checkpoint) / "commits").glob("[0-9]*"),
                         key=lambda p: int(p.name))
        commits[-1].unlink()
        pathlib.Path(commits[-1].parent, f".{commits[-1].name}.crc").unlink(missing_ok=True)
        job.Materializer(spark, cfg).run(available_now=True)
        assert len(catalog.load_table(ident).snapshots()) == snapshots

        # compaction (--compact, as the job's schedule does it): the same rows, no delete
        # file left for a reader to apply
        pg.run(f"update {t} set s = 'updated' where id = 1")
        run_router(router_cfg)
        running.run(available_now=True)
        want = {r[0]: tuple(r[1:]) for r in pg.run(f"select {cols} from {t}")}
        assert _iceberg_rows(catalog, ident, cols) == want
        assert _delete_files(catalog, ident) > 0
        ref = f"{name}.`{name}`.`public`.`{t}`"
        stored = len(_iceberg_rows(catalog, ident))  # live rows
        stats = dict(job.table_stats(cfg, spark=spark))[ref]
        assert stats["delete_files"] > 0 and stats["data_files"] > 0
        assert stats["rows"] == stored and stats["last_compaction"] is None
        assert job.compact(cfg, spark=spark) == [ref]
        assert _delete_files(catalog, ident) == 0
        assert _iceberg_rows(catalog, ident, cols) == want
        stats = dict(job.table_stats(cfg, spark=spark))[ref]
        assert (stats["rows"], stats["delete_files"]) == (stored, 0)
        assert stats["last_compaction"].startswith(str(dt.date.today().year))
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication if exists {name}")
        pg.run(f"drop table if exists {t}")
        if catalog is not None:
            catalog.engine.dispose()
        pg.run(f"drop database if exists {name} with (force)")


# --- helpers of the corpus and kill -9 tests ---------------------------------------------------


def _iceberg_setup(pg, tmp_path, pg_dsn, kafka_bootstrap, prefix: str):
    """A table name, the router's config, the job's ``JobConfig`` for Iceberg tables in a JDBC
    catalog in a database of its own (created here) and the pyiceberg catalog over it."""
    from pyiceberg.catalog.sql import SqlCatalog

    from tests.helpers import route_to_delta, unique

    name = unique(prefix)
    pg.run(f"create database {name}")
    host, port, user = pg.conn.info.host, pg.conn.info.port, pg.conn.info.user
    router_cfg, cfg = route_to_delta(tmp_path, dsn=pg_dsn, bootstrap=kafka_bootstrap,
                                     name=name, table=f"{name}_t")
    cfg.output_format, cfg.iceberg_catalog, cfg.iceberg_name = "iceberg", "jdbc", name
    cfg.iceberg_uri = f"jdbc:postgresql://{host}:{port}/{name}"
    cfg.iceberg_user, cfg.iceberg_warehouse = user, str(tmp_path / "wh")
    cfg.compact_interval = None
    catalog = SqlCatalog(name, uri=f"postgresql+psycopg2://{user}@{host}:{port}/{name}",
                         warehouse=f"file://{tmp_path / 'wh'}")
    return name, f"{name}_t", router_cfg, cfg, catalog


def _drop(pg, name: str, t: str, catalog) -> None:
    pg.drop_slot(name)
    pg.run(f"drop publication if exists {name}")
    pg.run(f"drop table if exists {t}")
    catalog.engine.dispose()
    pg.run(f"drop database if exists {name} with (force)")


def _stored(catalog, ident: tuple, key: str = "id", snapshot_id: int | None = None) -> dict:
    """The live rows (tombstones left out) as pyiceberg reads them, by key; a key stored twice
    (a duplicate, live or not) fails."""
    rows = catalog.load_table(ident).scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
    keys = [r[key] for r in rows]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)[:10]
    return {r[key]: r for r in rows if not r["_pgr_deleted"]}


_CORPUS_COLS = ("id int primary key, name text, amount numeric(10,2), at timestamptz, "
                "tags int[], note text, s smallint, o oid, b bool, f4 real, f8 double precision, "
                "d date, u uuid, j jsonb, by bytea, ts timestamp, iv interval, nu numeric, "
                "tx text[], tsi timestamptz")
#: PostgreSQL's side of each column in the shape pyiceberg returns it (text forms as text,
#: values Spark cannot hold as NULL)
_CORPUS_SELECT = ("select id, name, amount, at, tags, note, s, o::bigint, b, f4, f8, d, "
                  "u::text, j::text, by, ts, iv::text, nu::text, tx, "
                  "case when isfinite(tsi) then tsi end as tsi{extra} from {t}")


def _corpus_norm(r: dict) -> dict:
    import json
    import math

    out = {}
    for k, v in r.items():
        if k.startswith("_pgr_"):
            continue
        if isinstance(v, float) and math.isnan(v):
            v = "nan"
        elif isinstance(v, (bytes, bytearray, memoryview)):
            v = bytes(v)
        elif k == "j" and v is not None:
            v = json.loads(v)
        out[k] = v
    return out


def test_iceberg_type_corpus_toast_and_key_changes_through_pyiceberg(spark, pg_dsn,
                                                                    kafka_bootstrap, tmp_path):
    """The type corpus of the Delta pipeline tests (integers, NaN and infinite floats, arrays
    with NULLs, bytea, jsonb, uuid, timestamp and timestamptz, interval and unconstrained
    numeric as text, ±infinity as NULL), unchanged TOAST kept from the stored row (by an
    update and by a key change, whose value is read back from the Iceberg table), a column
    added, TRUNCATE: pyiceberg reads each committed batch equal to PostgreSQL, also after
    compaction and a change after it."""
    from actors.materialize import job
    from tests.helpers import Pg, run_router

    pg = Pg(pg_dsn)
    name, t, router_cfg, cfg, catalog = _iceberg_setup(pg, tmp_path, pg_dsn, kafka_bootstrap,
                                                       "mzc")
    ident, extra = (name, "public", t), [""]
    big = "x" * 5000
    values = ("i::smallint, (i * 1000)::oid, i % 2 = 0, "
              "case when i % 7 = 0 then 'NaN'::real else i / 4.0 end, "
              "case when i % 5 = 0 then '-Infinity'::float8 else i * 1.1 end, "
              "date '2024-02-29' + i, md5(i::text)::uuid, "
              "jsonb_build_object('i', i, 'q', 'a\"b'), decode(lpad(to_hex(i), 4, '0'), 'hex'), "
              "timestamp '2024-01-01 00:00:00.123456' + i * interval '1 hour', "
              "i * interval '1 day 02:03:04.5', case when i % 3 = 0 then 'NaN' else "
              "(i::numeric / 7)::text end::numeric, array['a,b', null, 'q\"' || i, '{}'], "
              "case when i % 4 = 0 then 'infinity'::timestamptz else now() end")

    def step():
        """One router run, one committed batch, pyiceberg against PostgreSQL."""
        run_router(router_cfg)
        job.Materializer(spark, cfg).run(available_now=True)
        with pg.conn.cursor() as cur:
            cur.execute(_CORPUS_SELECT.format(t=t, extra=extra[0]))
            names = [c.name for c in cur.description]
            want = {r[0]: _corpus_norm(dict(zip(names, r))) for r in cur.fetchall()}
        got = {k: _corpus_norm(r) for k, r in _stored(catalog, ident).items()}
        assert set(got) == set(want)
        for k in want:
            assert got[k] == want[k], k

    try:
        pg.run(f"create table {t} ({_CORPUS_COLS})")
        pg.run(f"alter table {t} alter column note set storage external")  # TOAST, uncompressed
        pg.run(f"create publication {name} for table {t}")
        pg.run(f"select pg_create_logical_replication_slot('{name}', 'pgoutput')")
        pg.run(f"insert into {t} select i, 'n' || i, i * 1.25, '2024-01-02 03:04:05+02', "
               f"array[i, null], '{big}' || i, {values} from generate_series(1, 40) i")
        pg.run(f"insert into {t} (id) values (41)")  # NULL in every other column
        step()
        # unchanged TOAST from the stored rows: plain updates and key changes (the moved row's
        # note comes from the Iceberg table), deletes, NULLs set
        pg.run(f"update {t} set name = 'toast kept', b = null where id <= 10")
        pg.run(f"update {t} set id = id + 1000, name = 'moved' where id between 16 and 18")
        pg.run(f"delete from {t} where id between 11 and 15")
        pg.run(f"update {t} set note = note || '!' where id = 19")  # TOAST changed
        step()
        assert _delete_files(catalog, ident) > 0
        pg.run(f"alter table {t} add column extra bigint")
        extra[0] = ", extra"
        pg.run(f"update {t} set extra = id * 2, name = 'toast again' where id >= 20")
        pg.run(f"update {t} set id = id + 2000 where id = 1016")  # moved twice, TOAST kept
        step()
        assert job.compact(cfg, spark=spark) == [f"{name}.`{name}`.`public`.`{t}`"]
        assert _delete_files(catalog, ident) == 0
        step()  # nothing new: the compacted table as it is
        pg.run(f"truncate {t}")
        pg.run(f"insert into {t} select i, 'after', i, now(), '{{}}', '{big}', {values} from "
               f"generate_series(100, 105) i")
        pg.run(f"update {t} set name = 'toast after truncate' where id = 100")
        step()
    finally:
        _drop(pg, name, t, catalog)


def test_iceberg_kill9_of_the_driver_mid_batch_no_duplicate_no_gap(spark, pg_dsn,
                                                                    kafka_bootstrap, tmp_path):
    """``pgrouter materialize`` writing Iceberg tables killed with SIGKILL (driver JVM and all)
    while it works through a backlog in small batches, then run again to the end: pyiceberg
    reads the table equal to PostgreSQL, no key stored twice, and every batch of the job
    committed once (no two snapshots carry one batch id)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from pyiceberg.exceptions import NoSuchTableError

    from tests.helpers import ROOT, Pg, run_router

    pg = Pg(pg_dsn)
    name, t, router_cfg, cfg, catalog = _iceberg_setup(pg, tmp_path, pg_dsn, kafka_bootstrap,
                                                       "mzk")
    ident = (name, "public", t)
    conf = tmp_path / "materialize.toml"
    template = f"""
[kafka]
bootstrap_servers = "{kafka_bootstrap}"
topic_pattern = '{cfg.topic_pattern}'
schema_topic = "{cfg.schema_topic}"
max_offsets_per_trigger = {{max_offsets}}
[spark]
master = "local[2]"
conf = {{ "spark.sql.shuffle.partitions" = "2" }}
[delta]
checkpoint = "{cfg.checkpoint}"
[output]
format = "iceberg"
[iceberg]
catalog = "jdbc"
name = "{name}"
uri = "{cfg.iceberg_uri}"
user = "{cfg.iceberg_user}"
warehouse = "{cfg.iceberg_warehouse}"
"""
    cmd = [sys.executable, "-m", "actors.cli", "materialize", "-c", str(conf),
           "--devstack-dir", str(ROOT / ".devstack")]
    try:
        pg.run(f"create table {t} (id int primary key, v int, pad text)")
        pg.run(f"create publication {name} for table {t}")
        pg.run(f"select pg_create_logical_replication_slot('{name}', 'pgoutput')")
        for i in range(20):  # transactions of inserts, updates and deletes over 300 keys
            lo = (i * 37) % 300
            pg.run(f"insert into {t} select k, {i}, 'p' || k from generate_series({lo}, "
                   f"{lo + 40}) k on conflict (id) do update set v = excluded.v + 1000")
            pg.run(f"update {t} set v = v + 1, pad = null where id % 7 = {i % 7}")
            pg.run(f"delete from {t} where id % 11 = {i % 11} and v % 2 = 0")
        run_router(router_cfg)

        conf.write_text(template.replace("{max_offsets}", "150"))
        log = open(tmp_path / "run1.log", "wb")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + 240
        try:
            while True:  # two batches committed, the job inside the next one
                assert proc.poll() is None, (tmp_path / "run1.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "materializer made no progress"
                try:
                    if len(catalog.load_table(ident).snapshots()) >= 2:
                        break
                except NoSuchTableError:
                    pass
                time.sleep(0.2)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the JVM is in the same new session
            proc.wait(timeout=30)
        before = len(catalog.load_table(ident).snapshots())
        conf.write_text(template.replace("{max_offsets}", "100000"))
        done = subprocess.run(cmd + ["--available-now"], cwd=ROOT, capture_output=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-3000:]

        want = {r[0]: (r[1], r[2]) for r in pg.run(f"select id, v, pad from {t}")}
        got = {k: (r["v"], r["pad"]) for k, r in _stored(catalog, ident).items()}
        assert got == want
        table = catalog.load_table(ident)
        assert len(table.snapshots()) > before  # the second run wrote what the first had not
        batches = [s.summary.get("pgrouter.batch-id") for s in table.snapshots()]
        batches = [b for b in batches if b is not None]
        assert len(batches) == len(set(batches)), sorted(batches, key=int)
    finally:
        _drop(pg, name, t, catalog)
