"""SQL for applying pgrouter records to a target table (``pgrouter apply``).

Rules:

* Values travel as text parameters cast to the target column's type
  (``$1::text::<type>``): records hold PostgreSQL's text form (or JSON numbers/booleans,
  turned back into text here), so every type round-trips through its input function.
* Rows are found by the target table's key (primary key, else replica-identity index),
  with the key values taken from ``before`` (the old key, present when the key changed or
  the table is REPLICA IDENTITY FULL) or else ``after``. A table without a key is matched
  on every column of ``before`` with ``IS NOT DISTINCT FROM``, one row at a time (ctid).
* Unchanged-TOAST columns are left out of ``after`` by the router; an UPDATE sets only the
  columns present, so the stored value stays.
* Columns a record names but the target table lacks are an ``ApplyError`` (with the
  table and column), never silently dropped.
"""

from __future__ import annotations

import dataclasses

from ..errors import ApplyError


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def to_text(value) -> str | None:
    if value is None:
        return None
    if value is True:
        return "t"
    if value is False:
        return "f"
    if type(value) is float:
        return repr(value)
    if isinstance(value, (dict, list)):  # never written by pgrouter; keep it lossless
        import json

        return json.dumps(value)
    return str(value)


@dataclasses.dataclass(eq=False)
class TargetTable:
    """A target table's columns (name -> SQL type) and key, read from its catalog."""

    schema: str
    name: str
    columns: dict[str, str]
    key: tuple[str, ...]
    #: columns of type json or jsonb (or a domain over them): records hold their text,
    #: which ``json_populate_recordset`` would store as a JSON string
    json_columns: frozenset[str] = frozenset()
    #: no trigger (foreign keys and constraint triggers are triggers that check at the
    #: end of a statement) and no rule, not partitioned: a one-row statement on it may
    #: carry the origin setup (``router.apply.batches.with_origin``)
    plain: bool = False

    def __post_init__(self):
        self.sql_name = f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    def _param(self, column: str, index: int) -> str:
        typ = self.columns.get(column)
        if typ is None:
            raise ApplyError(f"column {column!r} of {self.schema}.{self.name} is in the records "
                             "but not in the target table")
        return f"${index}::text::{typ}"

    def _assign(self, row: dict, args: list) -> list[str]:
        out = []
        for col, value in row.items():
            args.append(to_text(value))
            out.append(f"{quote_ident(col)} = {self._param(col, len(args))}")
        return out

    def where(self, before: dict | None, after: dict | None, args: list) -> str:
        """The condition finding the row a change is about."""
        if self.key:
            source = before if before and all(k in before for k in self.key) else after
            if source is None or not all(k in source for k in self.key):
                raise ApplyError(f"a change of {self.schema}.{self.name} lacks key columns "
                                 f"{list(self.key)}")
            parts = []
            for k in self.key:
                args.append(to_text(source[k]))
                parts.append(f"{quote_ident(k)} = {self._param(k, len(args))}")
            return " and ".join(parts)
        if not before:
            raise ApplyError(f"{self.schema}.{self.name} has no key on the target and the "
                             "change carries no old row (use REPLICA IDENTITY FULL)")
        parts = []
        for col, value in before.items():
            args.append(to_text(value))
            parts.append(f"{quote_ident(col)} is not distinct from {self._param(col, len(args))}")
        cond = " and ".join(parts)
        return f"ctid = (select ctid from {self.sql_name} where {cond} limit 1)"

    def insert(self, after: dict, conflict: str) -> tuple[str, list]:
        """INSERT; ``conflict``: ``error`` (plain), ``skip`` (returns a row only when
        inserted), ``upsert`` (returns true when inserted, false when it overwrote)."""
        args = [to_text(v) for v in after.values()]
        cols = ", ".join(quote_ident(c) for c in after)
        vals = ", ".join(self._param(c, i) for i, c in enumerate(after, 1))
        sql = f"insert into {self.sql_name} ({cols}) values ({vals})"
        if conflict == "skip":
            sql += " on conflict do nothing returning true"
        elif conflict == "upsert" and self.key:
            target = ", ".join(quote_ident(k) for k in self.key)
            sets = ", ".join(f"{quote_ident(c)} = excluded.{quote_ident(c)}" for c in after
                             if c not in self.key)
            action = f"do update set {sets}" if sets else "do nothing"
            sql += f" on conflict ({target}) {action} returning (xmax = 0)"
        return sql, args

    def update(self, before: dict | None, after: dict) -> tuple[str, list]:
        args: list = []
        sets = self._assign(after, args)
        if not sets:  # every column unchanged TOAST: only check that the row is there
            sets = [f"{quote_ident(next(iter(self.columns)))} = "
                    f"{quote_ident(next(iter(self.columns)))}"]
        cond = self.where(before, after, args)
        return f"update {self.sql_name} set {', '.join(sets)} where {cond}", args

    def delete(self, before: dict | None) -> tuple[str, list]:
        args: list = []
        cond = self.where(before, None, args)
        return f"delete from {self.sql_name} where {cond}", args

    def truncate(self, options: dict | None) -> str:
        sql = f"truncate table {self.sql_name}"
        if options and options.get("restart_identity"):
            sql += " restart identity"
        if options and options.get("cascade"):
            sql += " cascade"
        return sql


def affected(status: str) -> int:
    """Rows affected, from a command tag (``UPDATE 3``, ``INSERT 0 1``)."""
    try:
        return int(status.rsplit(" ", 1)[1])
    except (IndexError, ValueError, AttributeError):
        return 0


def key_of(table: TargetTable, before: dict | None, after: dict | None) -> dict:
    """The key values of a change, for conflict logs."""
    row = before or after or {}
    if table.key:
        return {k: row.get(k) for k in table.key}
    return dict(row)
