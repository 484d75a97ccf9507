"""One slot, eleven publication routes with different row filters, actions and column lists
on the same two tables; every topic must hold what PostgreSQL's own pgoutput replicates for
that route's publications.

The oracle is PostgreSQL itself: one extra slot per route, read through the SQL interface
(``pg_logical_slot_get_binary_changes`` with ``publication_names``), so the server applies the
publications' semantics; its stream is decoded and folded by key exactly like the topics.
No walsenders are used for the oracle.
"""

from __future__ import annotations

import pytest

from router.pgoutput import UNCHANGED_TOAST
from tests.e2e.pgoutput_oracle import slot_changes
from tests.helpers import (Pg, fold_rows, pg_text, read_topic, run_router, unique,
                           write_config)

pytestmark = pytest.mark.services

PUBLICATIONS = {  # name -> FOR TABLE ... WITH (...)
    "f0": "orders where (region = 'eu')",
    "f1": "orders where (amount > 500) with (publish = 'insert')",
    "f2": "orders (id, region, amount) where (region = 'us')",
    "f3": "orders where (id % 3 = 0)",
    "f4": "orders where (id < 50) with (publish = 'insert, update')",
    "f5": "orders (id, region, status)",
    "f6": "items where (qty >= 5)",
    "f7": "items where (qty < 3 and order_id % 2 = 0) with (publish = 'insert, delete')",
    "f8": "orders where (region in ('eu', 'ap') and id > 20), items where (order_id > 30)",
}
ROUTES = {f"r{k}": [k] for k in PUBLICATIONS} | {"rf0f3": ["f0", "f3"], "rf2f6": ["f2", "f6"]}



def oracle(pg: Pg, slot: str, pubs: list[str], key_names: dict) -> dict:
    """table -> {key: row} from PostgreSQL's own pgoutput for ``pubs`` (rows keyed by the
    primary key columns ``key_names[table]``)."""
    out: dict = {}
    for ch in slot_changes(pg, slot, ",".join(pubs)):
        if ch.op == "truncate":
            for rel in ch.relations:
                out.get(rel.name, {}).clear()
            continue
        rel = ch.relation
        table = out.setdefault(rel.name, {})
        names = [c.name for c in rel.columns]
        keys = [names.index(k) for k in key_names[rel.name]]
        if ch.old is not None:
            table.pop(tuple(ch.old[i] for i in keys), None)
        if ch.op == "delete":
            table.pop(tuple(ch.new[i] for i in keys), None) if ch.new else None
            continue
        key = tuple(ch.new[i] for i in keys)
        prev = table.get(key, {})
        table[key] = {n: (prev.get(n) if v is UNCHANGED_TOAST else v)
                      for n, v in zip(names, ch.new)}
    return out


def test_eleven_routes_match_postgres_pgoutput(pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    u = unique("fo")
    orders, items = f"orders_{u}", f"items_{u}"
    pg.run(f"create table {orders} (id int, region text, amount int, status text, "
           f"primary key (id, region))")
    pg.run(f"create table {items} (id int primary key, order_id int, qty int)")
    pg.run(f"alter table {items} replica identity full")
    for name, spec in PUBLICATIONS.items():
        spec = spec.replace("orders", orders).replace("items", items)
        pg.run(f"create publication {name}_{u} for table {spec}")
    pg.run(f"create publication sp_{u} for table {orders}, {items}")
    slot = f"{u}_router"
    oracle_slots = {r: f"{u}_{r}" for r in ROUTES}
    try:
        for s in [slot, *oracle_slots.values()]:
            pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", s)
        pg.run(f"insert into {orders} select g, (array['eu','us','ap'])[g % 3 + 1], g * 10, "
               f"'new' from generate_series(1, 90) g")
        pg.run(f"insert into {items} select g, g % 90 + 1, g % 8 from generate_series(1, 180) g")
        pg.run(f"update {orders} set region = 'eu' where id % 7 = 0")       # key changes
        pg.run(f"update {orders} set region = 'us' where id % 11 = 0 and region = 'eu'")
        pg.run(f"update {orders} set amount = amount + 5, status = 'paid' where id % 4 = 0")
        pg.run(f"update {items} set qty = qty + 3 where id % 5 = 0")        # crosses qty >= 5
        pg.run(f"update {items} set order_id = order_id + 40 where id % 9 = 0")
        pg.run(f"delete from {orders} where id % 10 = 0")
        pg.run(f"delete from {items} where id % 6 = 0")
        with pg.conn.cursor() as cur:  # one transaction touching both tables
            cur.execute(f"begin; insert into {orders} values (200, 'eu', 900, 'x'); "
                        f"update {items} set qty = 1 where id < 20; "
                        f"delete from {orders} where id = 21; commit")
        routes = "".join(f"""
[[routes]]
name = "{r}_{u}"
publications = [{', '.join(f'"{p}_{u}"' for p in pubs)}]
""" for r, pubs in ROUTES.items())
        cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=slot,
                           publications=[f"sp_{u}"], bootstrap=kafka_bootstrap, routes=routes)
        run_router(cfg)
        compared = 0
        for r, pubs in ROUTES.items():
            expected = oracle(pg, oracle_slots[r], [f"{p}_{u}" for p in pubs],
                              {orders: ["id", "region"], items: ["id"]})
            for table, key in ((orders, ["id", "region"]), (items, ["id"])):
                want = expected.get(table, {})
                # a topic that must stay empty is read too: absent or without records (the
                # router has exited: an absent topic is not waited for)
                records = read_topic(kafka_bootstrap, f"{r}_{u}.public.{table}", timeout=10,
                                     missing_ok=not want, settle=0)
                got = {tuple(pg_text(k) for k in kk): {c: pg_text(v) for c, v in row.items()}
                       for kk, row in fold_rows(records, key).items()}
                assert got == want, (r, table, {k: (want.get(k), got.get(k))
                                                for k in want.keys() ^ got.keys()})
                compared += len(want)
        assert compared > 300
    finally:
        for s in [slot, *oracle_slots.values()]:
            pg.drop_slot(s)
        pg.run(" ".join(f"drop publication if exists {p}_{u};" for p in [*PUBLICATIONS, "sp"]))
        pg.run(f"drop table if exists {orders}, {items}")
        pg.close()
