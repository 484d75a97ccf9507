"""The router's own CPU per outbox event against a plain route's record of the same insert,
in-process (no PostgreSQL, no Kafka): ``ChangeRouter.route`` over one transaction of
``--rows`` inserts into Debezium's outbox table (uuid id, varchar aggregatetype, aggregateid
and type, jsonb payload; ``--types`` aggregate types), once through an outbox route
(``type`` as a header) and once through a plain route, alternating, best of ``--repeat``,
``time.process_time`` (other processes' load counts less), position headers on.

    .venv/bin/python bench/outbox_route.py [--rows 100000] [--types 8] [--repeat 3] [--gc-off]

``--gc-off`` turns the garbage collector off: the difference is what the records' tracked
objects cost it. ``PGROUTER_PURE_PYTHON=1`` runs the Python twins.
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from router.stream.changes import Change, Changes  # noqa: E402
from router.native import describe  # noqa: E402
from router.routing.outbox import OutboxConfig  # noqa: E402
from router.pgoutput import Relation, RelationColumn  # noqa: E402
from router.routing.change_router import ChangeRouter, RouteSpec  # noqa: E402
from router.stream.transactions import Transaction  # noqa: E402

UUID, VARCHAR, JSONB = 2950, 1043, 3802
OUTBOX = Relation(1, "public", "outbox", "d", (
    RelationColumn(1, "id", UUID, -1), RelationColumn(0, "aggregatetype", VARCHAR, -1),
    RelationColumn(0, "aggregateid", VARCHAR, -1), RelationColumn(0, "type", VARCHAR, -1),
    RelationColumn(0, "payload", JSONB, -1)))


def transaction(rows: int, types: int) -> Transaction:
    changes = [Change("insert", 1000 + i, OUTBOX, new=(
        f"6ba7b810-9dad-11d1-80b4-{i:012d}", f"t_{i % types}", str(i % 1000), "OrderCreated",
        '{"note": "an order of %d", "order": %d, "lines": [%d, %d]}' % (i, i, i, i + 1)))
        for i in range(rows)]
    return Transaction(5, 100, 100, 101, 789_000_000_000, None, None, None,
                       Changes(changes, (), None, (), frozenset(), rows), rows)


def per_event(kind: str, txn: Transaction, repeat: int) -> float:
    spec = (RouteSpec(name="ev", all_tables=True, outbox=OutboxConfig(headers=["type"]))
            if kind == "outbox" else RouteSpec(name="cdc", all_tables=True))
    router = ChangeRouter([spec], db="d", position_headers=True)
    list(router.route(txn))  # plans, topics, schemas
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        records = sum(len(c.records) for c in router.route(txn))
        best = min(best, time.process_time() - started)
    assert records == txn.change_count
    return best / txn.change_count * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--types", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gc-off", action="store_true")
    args = ap.parse_args()
    if args.gc_off:
        gc.disable()
    txn = transaction(args.rows, args.types)
    got = {"outbox": [], "plain": []}
    for _ in range(2):
        for kind in got:
            got[kind].append(per_event(kind, txn, args.repeat))
    outbox, plain = min(got["outbox"]), min(got["plain"])
    print(f"hot path {describe()}, gc {'off' if args.gc_off else 'on'}: outbox "
          f"{outbox:.2f} µs/event, plain {plain:.2f} µs/record, ratio {outbox / plain:.2f}")


if __name__ == "__main__":
    main()
