"""pgrouter's row filters against PostgreSQL itself.

A seeded generator writes random, well-typed filter expressions over every supported type and
random rows full of edge values (NULL, NaN, ±Infinity, -0, extreme integers, empty strings,
padded bpchar, non-ASCII text). PostgreSQL evaluates each expression on each row (rows live in a
real table, so nothing is constant-folded that pgoutput would not fold either); pgrouter gets
the same rows in text form, as pgoutput would send them, and must return the same value or fail
where PostgreSQL fails. A sample of the expressions is also installed as real publication
filters, and what ``pg_get_expr`` prints is compiled again and must give the same results.

The database is created with collation "C" (pgrouter compares text in byte order) and the
session uses TimeZone=UTC, as the router does.
"""

from __future__ import annotations

import os
import random
import urllib.parse

import psycopg2
import psycopg2.errors
import pytest

from router.errors import FilterError
from router.rowfilter import ColumnType, compile_filter
from router.rowfilter.errors import FilterEvaluationError

DB = "pgrouter_rowfilter_diff"
SEED = int(os.environ.get("PGROUTER_ROWFILTER_SEED", "20240501"))
N_ROWS = 60
N_EXPRS = int(os.environ.get("PGROUTER_ROWFILTER_EXPRS", "260"))
BATCH = 50


def _connect(dsn: str, dbname: str | None = None):
    if dbname:
        parts = urllib.parse.urlsplit(dsn)
        dsn = urllib.parse.urlunsplit(parts._replace(path="/" + dbname))
    conn = psycopg2.connect(dsn, options="-c TimeZone=UTC -c DateStyle=ISO -c extra_float_digits=1")
    conn.autocommit = True
    return conn


@pytest.fixture(scope="module")
def cdb(pg_dsn):
    admin = _connect(pg_dsn)
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {DB} TEMPLATE template0 ENCODING 'UTF8' "
                    "LC_COLLATE 'C' LC_CTYPE 'C'")
    conn = _connect(pg_dsn, DB)
    try:
        yield conn
    finally:
        conn.close()
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.close()


@pytest.fixture(scope="module")
def table(cdb):
    rng = random.Random(SEED)
    cols = ", ".join(f"{name} {sqltype}" for name, sqltype, _ in COLUMNS)
    with cdb.cursor() as cur:
        cur.execute(f"CREATE TABLE t (id int PRIMARY KEY, {cols})")
        for rid in range(N_ROWS):
            row = random_row(rng)
            casts = ", ".join(f"%s::{sqltype}" for _, sqltype, _ in COLUMNS)
            cur.execute(f"INSERT INTO t VALUES (%s, {casts})", [rid, *row])
        # the rows exactly as pgoutput would send them: each column's output function
        # (concat() calls it; a ::text cast would strip bpchar's padding)
        texts = ", ".join(f"CASE WHEN {name} IS NULL THEN NULL ELSE concat({name}) END"
                          for name, _, _ in COLUMNS)
        cur.execute(f"SELECT id::text, {texts} FROM t ORDER BY t.id")
        rows = [list(r) for r in cur.fetchall()]
    columns = [ColumnType("id", 23)] + [ColumnType(name, oid) for name, _, oid in COLUMNS]
    return rows, columns


def _pg_eval(cur, exprs: list[str], n_rows: int):
    """{expr index: list of per-row results, or 'error' per row} evaluated by PostgreSQL."""
    results: dict[int, list] = {}
    try:
        cur.execute("SELECT " + ", ".join(f"({e})" for e in exprs) + " FROM t ORDER BY id")
        rows = cur.fetchall()
        for k in range(len(exprs)):
            results[k] = [r[k] for r in rows]
        return results
    except psycopg2.Error:
        pass
    for k, e in enumerate(exprs):
        try:
            cur.execute(f"SELECT ({e}) FROM t ORDER BY id")
            results[k] = [r[0] for r in cur.fetchall()]
        except psycopg2.Error as exc:
            if exc.pgcode and not exc.pgcode.startswith("42"):  # fails at run time
                per_row = []
                for rid in range(n_rows):
                    try:
                        cur.execute(f"SELECT ({e}) FROM t WHERE id = {rid}")
                        per_row.append(cur.fetchone()[0])
                    except psycopg2.Error:
                        per_row.append("error")
                results[k] = per_row
            else:
                results[k] = f"rejected: {exc.pgcode} {exc.pgerror.splitlines()[0]}"
    return results


def _ours(expr: str, columns, rows):
    try:
        flt = compile_filter(expr, columns)
    except FilterError as exc:
        return f"refused: {exc}"
    except Exception as exc:
        return [f"crash: {exc!r}"]
    out = []
    for row in rows:
        try:
            out.append(flt.evaluate(row))
        except FilterEvaluationError:
            out.append("error")
        except Exception as exc:  # a crash is a mismatch to report, not an abort
            out.append(f"crash: {exc!r}")
    return out


def _agree(pg, ours) -> bool:
    if isinstance(pg, str):  # PostgreSQL refused the expression
        return isinstance(ours, str)
    if isinstance(ours, str):
        # a constant subexpression that fails: PostgreSQL fails on every row too
        return all(v == "error" for v in pg)
    return pg == ours


def test_differential_against_postgresql(cdb, table):
    rows, columns = table
    gen = ExprGen(random.Random(SEED + 1))
    exprs = [gen.boolean() for _ in range(N_EXPRS)]
    mismatches = []
    pairs = 0
    with cdb.cursor() as cur:
        for start in range(0, len(exprs), BATCH):
            chunk = exprs[start:start + BATCH]
            pg = _pg_eval(cur, chunk, len(rows))
            for k, e in enumerate(chunk):
                ours = _ours(e, columns, rows)
                if not isinstance(pg[k], str):  # only rows PostgreSQL evaluated count
                    pairs += sum(v != "error" for v in pg[k])
                if not _agree(pg[k], ours):
                    mismatches.append((e, pg[k], ours))
    print(f"{pairs} (expression, row) pairs evaluated by both")
    assert pairs >= 10_000, f"only {pairs} pairs PostgreSQL evaluated: the generator drifted"
    detail = "\n".join(f"{e}\n  pg:   {p}\n  ours: {o}" for e, p, o in mismatches[:10])
    assert not mismatches, f"{len(mismatches)} of {len(exprs)} expressions differ:\n{detail}"


def test_generated_filters_are_publication_filters(cdb, table):
    """Every sampled expression is accepted by CREATE PUBLICATION; what pg_get_expr prints
    compiles and gives PostgreSQL's results."""
    rows, columns = table
    gen = ExprGen(random.Random(SEED + 2))
    sample = [gen.boolean() for _ in range(60)]
    with cdb.cursor() as cur:
        for i, expr in enumerate(sample):
            pg = _pg_eval(cur, [expr], len(rows))[0]
            if isinstance(pg, str):
                continue
            cur.execute(f"CREATE PUBLICATION rf_{i} FOR TABLE t WHERE ({expr}) "
                        "WITH (publish = 'insert')")
            cur.execute("SELECT pg_get_expr(prqual, prrelid) FROM pg_publication_rel r "
                        "JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = %s",
                        [f"rf_{i}"])
            printed = cur.fetchone()[0]
            cur.execute(f"DROP PUBLICATION rf_{i}")
            ours = _ours(printed, columns, rows)
            assert _agree(pg, ours), f"{expr}\nprinted: {printed}\npg: {pg}\nours: {ours}"


REFUSED = [
    "c::int > 5",                      # cast through text (CoerceViaIO)
    "a::text = '5'",
    "now() > tz",                      # stable
    "random() > 0.5",                  # volatile
    "concat(c, 'x') = 'ax'",           # stable (calls output functions)
    "to_char(a, '999') = '  5'",
    "date_trunc('day', tz) = '2024-01-01'",  # timestamptz variant is stable
    "tz::date = '2024-01-01'",
    "d < tz",
    "ctid = '(0,1)'",                  # system columns
    "xmin = '1'",
    "a = (SELECT 1)",                  # subquery
    "EXISTS (SELECT 1)",
    "count(*) > 1",                    # aggregate
    "row_number() OVER () > 1",        # window function
    "generate_series(1, 2) = 1",       # set-returning
    "tz > current_timestamp",
    "my_function(a) > 1",              # does not exist / user-defined
    "c || 1 = 'x1'",                   # anytextcat is stable
]


@pytest.mark.parametrize("expr", REFUSED)
def test_refused_like_postgresql(cdb, table, expr):
    _, columns = table
    with cdb.cursor() as cur:
        with pytest.raises(psycopg2.Error):
            cur.execute(f"CREATE PUBLICATION rf_refused FOR TABLE t WHERE ({expr})")
    with pytest.raises(FilterError) as info:
        compile_filter(expr, columns)
    assert info.value.line >= 1 and info.value.column >= 1


# --- generator -------------------------------------------------------------------------------

COLUMNS = [  # name, SQL type, type oid
    ("a", "int4", 23), ("s", "int2", 21), ("b", "int8", 20), ("n", "numeric", 1700),
    ("f", "float8", 701), ("r", "float4", 700), ("c", "text", 25), ("v", "varchar(10)", 1043),
    ("bp", "char(5)", 1042), ("bo", "bool", 16), ("d", "date", 1082),
    ("ts", "timestamp", 1114), ("tz", "timestamptz", 1184), ("u", "uuid", 2950),
]

EDGE = {
    "int4": ["0", "1", "-1", "7", "-7", "42", "2147483647", "-2147483648", "100000", "-3"],
    "int2": ["0", "1", "-1", "5", "32767", "-32768", "300", "-12"],
    "int8": ["0", "1", "-1", "9223372036854775807", "-9223372036854775808", "5000000000", "3"],
    "numeric": ["0", "1.5", "-2.25", "1e20", "123456789.123456789", "NaN", "0.000001",
                "Infinity", "-Infinity", "7", "-0.5", "2.50"],
    "float8": ["NaN", "Infinity", "-Infinity", "-0", "0", "1.5", "1e308", "-1e-308", "0.1",
               "2.5", "-3", "1e15"],
    "float4": ["NaN", "Infinity", "-Infinity", "-0", "0", "1.5", "3.4e38", "0.1", "-2.5", "7"],
    "text": ["", "abc", "ABC", "NSW", "a%b", "a_b", "ünï", "日本語", "x\\y", " a ", "abc ",
             "Abc", "nsw", "b"],
    "varchar(10)": ["", "abc", "ABC", "hello", "ü", "a b", "NSW ", "z"],
    "char(5)": ["ab", "", "abc  ", "ABCDE", "ü", "NSW", " x"],
    "bool": ["t", "f"],
    "date": ["2024-01-01", "1999-12-31", "infinity", "-infinity", "2000-02-29", "2024-06-15",
             "1970-01-01"],
    "timestamp": ["2024-01-01 00:00:00", "2024-06-30 23:59:59.999999", "infinity",
                  "-infinity", "1970-01-01 00:00:00", "2024-01-01 12:30:00", "1999-12-31 23:00:00"],
    "timestamptz": ["2024-01-01 00:00:00+00", "2024-06-30 23:59:59.5+05:30", "infinity",
                    "2024-01-01 12:30:00-08", "1970-01-01 00:00:00+00"],
    "uuid": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-000000000000",
             "ffffffff-ffff-ffff-ffff-ffffffffffff", "123e4567-e89b-12d3-a456-426614174000"],
}


def random_row(rng: random.Random) -> list:
    row = []
    for _, sqltype, _ in COLUMNS:
        if rng.random() < 0.15:
            row.append(None)
        elif sqltype == "int4" and rng.random() < 0.3:
            row.append(str(rng.randint(-1000, 1000)))
        elif sqltype == "float8" and rng.random() < 0.3:
            row.append(repr(rng.uniform(-1e6, 1e6)))
        elif sqltype == "numeric" and rng.random() < 0.3:
            row.append(str(round(rng.uniform(-1000, 1000), rng.randint(0, 5))))
        else:
            row.append(rng.choice(EDGE[sqltype]))
    return row


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


NUM_KINDS = ["int2", "int4", "int8", "numeric", "float4", "float8"]
NUM_COLS = {"int2": "s", "int4": "a", "int8": "b", "numeric": "n", "float4": "r", "float8": "f"}
SQLNAME = {"int2": "smallint", "int4": "integer", "int8": "bigint", "numeric": "numeric",
           "float4": "real", "float8": "double precision"}


class ExprGen:
    """Random well-typed filter expressions over the supported grammar."""

    def __init__(self, rng: random.Random):
        self.r = rng

    def pick(self, *options):
        return self.r.choice(options)

    def boolean(self, depth: int = 0) -> str:
        r = self.r
        if depth > 2:
            return self.compare(depth)
        k = r.random()
        if k < 0.35:
            return self.compare(depth)
        if k < 0.50:
            op = self.pick("AND", "OR")
            return f"({self.boolean(depth + 1)} {op} {self.boolean(depth + 1)})"
        if k < 0.55:
            return f"NOT ({self.boolean(depth + 1)})"
        if k < 0.62:
            kind = self.any_kind()
            neg = self.pick("", "NOT ")
            return f"({self.value(kind, depth + 1)} IS {neg}NULL)"
        if k < 0.66:
            test = self.pick("TRUE", "FALSE", "UNKNOWN")
            return f"(({self.boolean(depth + 1)}) IS {self.pick('', 'NOT ')}{test})"
        if k < 0.71:
            kind = self.any_kind()
            return (f"({self.value(kind, depth + 1)} IS {self.pick('', 'NOT ')}DISTINCT FROM "
                    f"{self.value(kind, depth + 1)})")
        if k < 0.77:
            kind = self.any_kind()
            items = ", ".join(self.value(kind, depth + 2) for _ in range(r.randint(1, 4)))
            return f"({self.value(kind, depth + 1)} {self.pick('', 'NOT ')}IN ({items}))"
        if k < 0.82:
            kind = self.pick("int4", "numeric", "float8", "text", "date", "int8")
            sym = self.pick("", "", "SYMMETRIC ")
            return (f"({self.value(kind, depth + 1)} {self.pick('', 'NOT ')}BETWEEN {sym}"
                    f"{self.value(kind, 3)} AND {self.value(kind, 3)})")
        if k < 0.88:
            op = self.pick("LIKE", "ILIKE", "NOT LIKE", "NOT ILIKE", "~~", "!~~*")
            pat = self.pick("'a%'", "'%b'", "'_b%'", "'%'", "''", "'ab_'", "'%\\%%'", "'ü%'",
                            "'NSW'", "'%c '", "'a\\_b'", "'A%'")
            return f"({self.text(depth + 1)} {op} {pat})"
        if k < 0.93:
            kind = self.pick("int4", "text", "numeric", "int8", "float8")
            op = self.pick("=", "<>", "<", ">=")
            quant = self.pick("ANY", "ALL")
            if r.random() < 0.5:
                items = ", ".join(self.literal(kind) for _ in range(r.randint(0, 3)))
                arr = f"ARRAY[{items}]::{SQLNAME.get(kind, kind)}[]" if items else \
                    f"'{{}}'::{SQLNAME.get(kind, kind)}[]"
            else:
                arr = "'{" + ",".join(self.pick("1", "2", "NULL", "-5") for _ in range(r.randint(1, 3))) + "}'"
                kind = self.pick("int4", "int8", "numeric")
            return f"({self.value(kind, depth + 1)} {op} {quant} ({arr}))"
        if k < 0.96:
            return f"starts_with({self.text(depth + 1)}, {self.pick(_q('a'), _q(''), _q('N'))})"
        if k < 0.98:
            return "bo"
        return (f"CASE WHEN {self.boolean(depth + 1)} THEN {self.boolean(depth + 2)} "
                f"ELSE {self.pick('true', 'false', 'NULL')} END")

    def any_kind(self) -> str:
        return self.pick("int2", "int4", "int8", "numeric", "float4", "float8", "text", "text",
                         "bpchar", "bool", "date", "timestamp", "timestamptz", "uuid")

    def compare(self, depth: int) -> str:
        kind = self.any_kind()
        op = self.pick("=", "<>", "<", "<=", ">", ">=", "!=")
        if kind in NUM_KINDS and self.r.random() < 0.4:
            other = self.pick(*NUM_KINDS)
            return f"({self.value(kind, depth + 1)} {op} {self.value(other, depth + 1)})"
        return f"({self.value(kind, depth + 1)} {op} {self.value(kind, depth + 1)})"

    def value(self, kind: str, depth: int) -> str:
        if kind in NUM_KINDS:
            return self.number(kind, depth)
        if kind == "text":
            return self.text(depth)
        if kind == "bpchar":
            return self.pick("bp", "bp", "'ab'::bpchar", "'abc  '::char(5)", "'NSW'",
                             "'ab   '")
        if kind == "bool":
            return self.pick("bo", "true", "false", "NULL::boolean") if depth > 2 else \
                self.pick("bo", "true", f"({self.boolean(depth + 1)})")
        if kind == "uuid":
            return self.pick("u", "u", _q(self.r.choice(EDGE["uuid"])) + "::uuid")
        if kind == "date":
            return self.pick("d", "d", "d", _q(self.r.choice(EDGE["date"])) + "::date",
                             "(d + 1)", "(d - 30)", "date '2024-01-01'")
        if kind == "timestamp":
            return self.pick("ts", "ts", _q(self.r.choice(EDGE["timestamp"])) + "::timestamp",
                             f"date_trunc({self.pick(*map(_q, ['day', 'month', 'hour', 'year', 'week', 'minute', 'quarter']))}, ts)",
                             "d::timestamp", "CAST(d AS timestamp without time zone)")
        if kind == "timestamptz":
            return self.pick("tz", "tz", _q(self.r.choice(EDGE["timestamptz"])) + "::timestamptz",
                             "'2024-01-01'::timestamp with time zone")
        raise AssertionError(kind)

    def literal(self, kind: str) -> str:
        r = self.r
        if kind == "text":
            return _q(r.choice(EDGE["text"]))
        if kind in ("int4", "int2"):
            return self.pick("0", "1", "-1", "5", "7", "-3", "42", "1000", "2147483647", "-2147483648")
        if kind == "int8":
            return self.pick("5000000000", "-1", "9223372036854775807", "3", "'0'::bigint")
        if kind == "numeric":
            return self.pick("1.5", "-2.25", "0.0", "'NaN'::numeric", "100", "3.14159",
                             "'1e20'::numeric", "7.0", "'Infinity'::numeric", "0.1")
        if kind == "float8":
            return self.pick("'NaN'::float8", "1.5::float8", "'-0'::float8", "'Infinity'::float8",
                             "0.1::double precision", "1e300::float8", "2::float8")
        if kind == "float4":
            return self.pick("'NaN'::real", "1.5::real", "0.1::float4", "'-Infinity'::real", "7::real")
        raise AssertionError(kind)

    def number(self, kind: str, depth: int) -> str:
        r = self.r
        if depth > 3:
            return self.pick(NUM_COLS[kind], self.literal(kind))
        k = r.random()
        if k < 0.3:
            return NUM_COLS[kind]
        if k < 0.45:
            return self.literal(kind)
        if k < 0.62:
            ops = ["+", "-", "*", "/"] + (["%"] if kind not in ("float4", "float8") else [])
            op = r.choice(ops)
            return f"({self.number(kind, depth + 1)} {op} {self.number(kind, depth + 1)})"
        if k < 0.66:
            return f"(- {self.number(kind, depth + 1)})"
        if k < 0.70:
            return f"abs({self.number(kind, depth + 1)})"
        if k < 0.76:
            src = r.choice(NUM_KINDS)
            return f"({self.number(src, depth + 1)})::{SQLNAME[kind]}"
        if k < 0.80:
            return f"CAST({self.number(self.pick(*NUM_KINDS), depth + 1)} AS {SQLNAME[kind]})"
        if k < 0.85:
            fn = self.pick("COALESCE", "GREATEST", "LEAST", "NULLIF")
            n = 2 if fn == "NULLIF" else r.randint(1, 3)
            args = ", ".join(self.number(kind, depth + 1) for _ in range(n))
            return f"{fn}({args})"
        if k < 0.88:
            return (f"CASE WHEN {self.boolean(3)} THEN {self.number(kind, depth + 1)} "
                    f"ELSE {self.number(kind, depth + 1)} END")
        if k < 0.90:
            return (f"CASE {NUM_COLS[kind]} WHEN {self.literal(kind)} THEN {self.number(kind, depth + 1)} "
                    f"WHEN {self.literal(kind)} THEN {self.literal(kind)} END")
        if kind == "numeric" and k < 0.95:
            return self.pick(f"round({self.number('numeric', depth + 1)}, {r.randint(-2, 4)})",
                             f"round(n)", "floor(n)", "ceil(n)", "trunc(n, 1)",
                             f"mod(n, {self.pick('3', '0.7', '-2')})", "(n)::numeric(10,2)")
        if kind == "float8" and k < 0.95:
            return self.pick("round(f)", "floor(f)", "ceil(f)", "ceiling(r)", "trunc(f)", "round(a)")
        if kind == "int4" and k < 0.95:
            return self.pick(f"length({self.text(depth + 1)})", "char_length(bp)",
                             "octet_length(c)", "mod(a, 7)", f"strpos({self.text(depth + 1)}, 'b')",
                             "position('a' in c)", "(d - '2024-01-01'::date)")
        return NUM_COLS[kind]

    def text(self, depth: int) -> str:
        r = self.r
        if depth > 3:
            return self.pick("c", "v", "bp", self.literal("text"))
        k = r.random()
        if k < 0.35:
            return self.pick("c", "c", "v", "bp", "(v)::text", "(bp)::text")
        if k < 0.45:
            return self.literal("text") + self.pick("", "::text", "::varchar")
        if k < 0.52:
            return f"({self.text(depth + 1)} || {self.text(depth + 1)})"
        if k < 0.58:
            return f"{self.pick('lower', 'upper')}({self.text(depth + 1)})"
        if k < 0.70:
            return self.pick(
                f"substr({self.text(depth + 1)}, {r.randint(-1, 3)})",
                f"substr({self.text(depth + 1)}, {r.randint(-1, 3)}, {r.randint(0, 3)})",
                f"SUBSTRING({self.text(depth + 1)} FROM {r.randint(0, 3)} FOR {r.randint(0, 3)})",
                f"\"left\"({self.text(depth + 1)}, {r.randint(-3, 3)})",
                f"right({self.text(depth + 1)}, {r.randint(-3, 3)})",
                f"replace({self.text(depth + 1)}, 'a', 'xy')",
                f"reverse({self.text(depth + 1)})")
        if k < 0.80:
            return self.pick(f"btrim({self.text(depth + 1)})", f"ltrim({self.text(depth + 1)})",
                             f"rtrim({self.text(depth + 1)}, 'c ')",
                             f"TRIM(BOTH 'a' FROM {self.text(depth + 1)})",
                             f"trim(leading from {self.text(depth + 1)})",
                             f"trim({self.text(depth + 1)})")
        if k < 0.88:
            args = ", ".join(self.text(depth + 1) for _ in range(r.randint(1, 3)))
            return f"{self.pick('COALESCE', 'GREATEST', 'LEAST')}({args})"
        if k < 0.92:
            return f"NULLIF({self.text(depth + 1)}, {self.text(depth + 1)})"
        return (f"CASE WHEN {self.boolean(3)} THEN {self.text(depth + 1)} "
                f"ELSE {self.text(depth + 1)} END")
