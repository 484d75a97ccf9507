"""The Delta tables the job writes: what the driver remembers of each (``TableState``), their
creation, and columns added or widened when a table's schema changes.

Rules: a table is created by the first write of its rows, with its data and its properties in
one commit (``write_first``); a first batch that starts with a truncate (recorded in a table
property) or whose key changes need stored unchanged-TOAST values creates it empty first
(``create``). The key columns are kept in
the table property ``pgrouter.key`` and must never change; a truncate's position in
``pgrouter.truncated_before``. Schema changes: new columns are added, a widening type change
widens the column in place (Delta type widening), anything else is refused with
``MaterializeError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .columns import quote, table_path, widens
from .settings import STATE, JobConfig, MaterializeError

TRUNCATE_PROPERTY = "pgrouter.truncated_before"
KEY_PROPERTY = "pgrouter.key"


@dataclass
class TableState:
    path: str
    types: dict[str, str]  # column -> Spark DDL type, as stored
    truncated_before: tuple[int, int] | None
    key: tuple[str, ...] | None
    empty: bool = False  # planned or created by this job, no rows yet: no MERGE needed
    created: bool = True  # False: not in storage yet, the first write creates it


class DeltaTables:
    kind = "Delta"
    #: the table format in ``CREATE TABLE … USING``
    using = "delta"

    def __init__(self, spark, cfg: JobConfig):
        self.spark, self.cfg = spark, cfg
        self.known: dict[str, TableState] = {}

    def ensure(self, route, schema, table, wanted: dict[str, str], keys) -> TableState:
        """The state of the table for ``wanted`` columns (name -> Spark type), with missing
        columns added and narrower ones widened; a table not in storage yet is only planned."""
        from delta.tables import DeltaTable

        path = table_path(self.cfg.warehouse, route, schema, table)
        if path not in self.known and DeltaTable.isDeltaTable(self.spark, path):
            dt = DeltaTable.forPath(self.spark, path)
            types = {f.name: f.dataType.simpleString() for f in dt.toDF().schema.fields}
            props = dt.detail().collect()[0].properties or {}
            tb = props.get(TRUNCATE_PROPERTY)
            key = props.get(KEY_PROPERTY)
            self.known[path] = TableState(path, types,
                                          tuple(int(x) for x in tb.split(":")) if tb else None,
                                          tuple(json.loads(key)) if key else None)
        return self._ensure(path, schema, table, wanted, keys)

    def _ensure(self, path, schema, table, wanted: dict[str, str], keys) -> TableState:
        """``ensure`` once the table's stored state is known (``known``) or it is not stored:
        a new table is planned, missing columns are added, narrower ones widened."""
        state = self.known.get(path)
        if state is None:
            cols = dict(wanted)
            if self.cfg.mode == STATE:
                cols.update(_pgr_commit_lsn="bigint", _pgr_seq="bigint", _pgr_deleted="boolean",
                            _pgr_deleted_at="timestamp")
            else:
                cols.update(_pgr_op="string", _pgr_commit_lsn="bigint", _pgr_seq="bigint",
                            _pgr_lsn="bigint", _pgr_xid="bigint", _pgr_commit_time="timestamp",
                            _pgr_schema_id="string", _pgr_toast="array<string>",
                            _pgr_before="string")
            state = self.known[path] = TableState(path, cols, None, tuple(keys), empty=True,
                                                  created=False)
        if state.key is not None and self.cfg.mode == STATE and tuple(keys) != state.key:
            raise MaterializeError(f"{schema}.{table}: key columns changed from "
                                   f"{list(state.key)} to {list(keys)}")
        if self.cfg.mode == STATE and "_pgr_deleted_at" not in state.types:
            wanted = {**wanted, "_pgr_deleted_at": "timestamp"}  # tables made before it existed
        for n, t in wanted.items():
            have = state.types.get(n)
            if have is None:
                self._add_column(path, n, t)
                state.types[n] = t
            elif have != t and widens(have, t):
                self._widen(path, n, t)
                state.types[n] = t
            elif not widens(t, have):  # a narrower type (an older schema's) fits the column
                raise MaterializeError(f"{schema}.{table}.{n}: incompatible type change: the "
                                       f"{self.kind} table has {have}, the new schema needs "
                                       f"{t}, which is not a widening of it; materialize into "
                                       f"a new "
                                       f"warehouse or migrate the table")
        return state

    def _add_column(self, path: str, name: str, dtype: str) -> None:
        self.spark.sql(f"ALTER TABLE delta.{quote(path)} ADD COLUMNS ({quote(name)} {dtype})")

    def ref(self, state: TableState) -> str:
        """The table's name in SQL."""
        return f"delta.{quote(state.path)}"

    def read(self, state: TableState, session=None):
        return (session or self.spark).read.format("delta").load(state.path)

    def committed(self, state: TableState, batch_id: int) -> bool:
        """Delta skips a re-run batch by itself (``txnAppId``/``txnVersion``)."""
        return False

    def _properties(self, state: TableState) -> dict[str, str]:
        return {KEY_PROPERTY: json.dumps(list(state.key or ()))}

    def create(self, state: TableState) -> None:
        """Create a planned table empty (a first batch that starts with a truncate)."""
        if state.created:
            return
        ddl = ", ".join(f"{quote(n)} {t}" for n, t in state.types.items())
        props = ", ".join(f"'{k}' = '{v}'" for k, v in self._properties(state).items())
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS {self.ref(state)} ({ddl}) "
                       f"USING {self.using} TBLPROPERTIES ({props})")
        state.created = True

    def write_first(self, state: TableState, rows) -> None:
        """The first rows of a table this job planned or created: one commit that creates the
        table with them (a MERGE into an empty table would insert every row anyway). Every
        column of ``state.types`` is written with its type (Delta makes a new table's columns
        nullable whatever the batch held)."""
        from pyspark.sql import functions as F

        rows = rows.select(*[F.col(quote(n)).cast(t).alias(n) for n, t in state.types.items()])
        if state.created:
            rows.write.format("delta").mode("append").save(state.path)
        else:
            writer = rows.writeTo(f"delta.{quote(state.path)}").using("delta")
            for k, v in self._properties(state).items():
                writer = writer.tableProperty(k, v)
            writer.create()
            state.created = True
        state.empty = False

    def _widen(self, path: str, column: str, dtype: str) -> None:
        """Delta type widening (table feature ``typeWidening``): existing files keep the old
        type and are read as the new one."""
        t = f"delta.{quote(path)}"
        self.spark.sql(f"ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
        self.spark.sql(f"ALTER TABLE {t} ALTER COLUMN {quote(column)} TYPE {dtype}")
