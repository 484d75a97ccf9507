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
        assert job.compact(cfg, spark=spark) == [f"{name}.`{name}`.`public`.`{t}`"]
        assert _delete_files(catalog, ident) == 0
        assert _iceberg_rows(catalog, ident, cols) == want
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication if exists {name}")
        pg.run(f"drop table if exists {t}")
        if catalog is not None:
            catalog.engine.dispose()
        pg.run(f"drop database if exists {name} with (force)")
