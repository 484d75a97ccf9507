"""Schema evolution through the whole pipeline (PostgreSQL -> ``pgrouter run`` -> Kafka ->
materializer -> Delta) while one materializer keeps running across the changes: a column added,
a column dropped, int widened to bigint and varchar(n) to text apply; a change that is not a
widening stops the job with one message naming the column."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.services, pytest.mark.spark]


def test_schema_evolution_while_running(spark, pg_dsn, kafka_bootstrap, tmp_path):
    from actors.materialize import job
    from tests.helpers import Pg, route_to_delta, run_router, unique

    pg = Pg(pg_dsn)
    name = unique("mzs")
    t = f"{name}_t"
    pg.run(f"create table {t} (id int primary key, n int, s varchar(10), gone text)")
    pg.run(f"create publication {name} for table {t}")
    router_cfg, cfg = route_to_delta(tmp_path, dsn=pg_dsn, bootstrap=kafka_bootstrap,
                                         name=name, table=t)
    path = f"{cfg.warehouse}/{name}/public/{t}"
    running = job.Materializer(spark, cfg)  # one driver state across every change below

    def compare(columns: str) -> dict:
        run_router(router_cfg)
        running.run(available_now=True)
        df = spark.read.format("delta").load(path)
        got = {r["id"]: tuple(r[c.strip()] for c in columns.split(",")[1:])
               for r in df.filter("NOT _pgr_deleted").collect()}
        want = {r[0]: tuple(r[1:]) for r in pg.run(f"select {columns} from {t}")}
        assert got == want
        return {f.name: f.dataType.simpleString() for f in df.schema.fields}

    try:
        pg.run(f"select pg_create_logical_replication_slot('{name}', 'pgoutput')")
        pg.run(f"insert into {t} select i, i * 10, 's' || i, 'g' || i from generate_series(1, 20) i")
        types = compare("id, n, s, gone")
        assert (types["n"], types["s"], types["gone"]) == ("int", "string", "string")

        pg.run(f"alter table {t} alter column n type bigint")
        pg.run(f"alter table {t} alter column s type text")
        pg.run(f"alter table {t} drop column gone")
        pg.run(f"alter table {t} add column extra numeric(8,2)")
        pg.run(f"insert into {t} values (100, 5000000000, repeat('long ', 20), 1.25)")
        pg.run(f"update {t} set n = n + 4000000000, extra = 2.5 where id <= 5")
        pg.run(f"delete from {t} where id between 6 and 8")
        types = compare("id, n, s, extra")
        assert (types["n"], types["s"], types["extra"]) == ("bigint", "string", "decimal(8,2)")
        # a dropped column stays in the table, NULL in rows written since
        gone = {r["id"]: r["gone"] for r in spark.read.format("delta").load(path).collect()}
        assert gone[100] is None and gone[1] is None and gone[10] == "g10"

        pg.run(f"alter table {t} alter column extra type numeric(12,2)")  # a wider decimal
        pg.run(f"update {t} set extra = 1234567890.12 where id = 100")
        types = compare("id, n, s, extra")
        assert types["extra"] == "decimal(12,2)"

        pg.run(f"alter table {t} alter column n type text")  # not a widening: refused
        pg.run(f"update {t} set n = 'text now' where id = 100")
        run_router(router_cfg)
        with pytest.raises(job.MaterializeError,
                           match=rf"public\.{t}\.n: incompatible type change: the Delta table "
                                 r"has bigint, the new schema needs string"):
            running.run(available_now=True)
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication if exists {name}")
