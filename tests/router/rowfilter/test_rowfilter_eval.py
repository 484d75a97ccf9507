"""Table-driven row-filter cases: (expression, row, expected), NULLs included.

Columns: a int4, b int8, s int2, n numeric, f float8, r float4, c text, v varchar,
bp char(5) (values padded as pgoutput sends them), bo bool, d date, ts timestamp,
tz timestamptz, u uuid.
"""

from __future__ import annotations

import pytest

from router.errors import FilterError
from router.rowfilter import ColumnType, RowFilter, compile_filter
from router.rowfilter.errors import FilterEvaluationError

COLS = [ColumnType("a", 23), ColumnType("b", 20), ColumnType("s", 21), ColumnType("n", 1700),
        ColumnType("f", 701), ColumnType("r", 700), ColumnType("c", 25), ColumnType("v", 1043),
        ColumnType("bp", 1042, 9), ColumnType("bo", 16), ColumnType("d", 1082),
        ColumnType("ts", 1114), ColumnType("tz", 1184), ColumnType("u", 2950)]
NAMES = [c.name for c in COLS]


def row(**values):
    return [values.get(name) for name in NAMES]


CASES = [
    # comparison and three-valued logic
    ("a > 5 AND c = 'NSW'", row(a="6", c="NSW"), True),
    ("a > 5 AND c = 'NSW'", row(a="5", c="NSW"), False),
    ("a > 5 AND c = 'NSW'", row(a=None, c="NSW"), None),
    ("a > 5 AND c = 'NSW'", row(a="1", c=None), False),
    ("a > 5 OR c = 'NSW'", row(a=None, c="NSW"), True),
    ("a > 5 OR c = 'NSW'", row(a=None, c="VIC"), None),
    ("NOT (a > 5)", row(a=None), None),
    ("a != 5", row(a="4"), True),
    ("((a > 5) AND (c = 'NSW'::text))", row(a="7", c="NSW"), True),
    # IS tests
    ("a IS NULL", row(), True),
    ("a IS NOT NULL", row(a="0"), True),
    ("(a > 5) IS UNKNOWN", row(), True),
    ("(a > 5) IS NOT TRUE", row(), True),
    ("bo IS FALSE", row(bo="f"), True),
    ("a IS DISTINCT FROM NULL", row(a="1"), True),
    ("a IS NOT DISTINCT FROM NULL", row(), True),
    ("NOT (a IS DISTINCT FROM 3)", row(a="3"), True),
    # IN / ANY / ALL / BETWEEN
    ("a IN (1, 2, 3)", row(a="2"), True),
    ("a IN (1, NULL)", row(a="2"), None),
    ("a NOT IN (1, 2)", row(a="3"), True),
    ("a NOT IN (1, NULL)", row(a="3"), None),
    ("(a = ANY (ARRAY[1, 2]))", row(a="2"), True),
    ("(b <> ALL ('{1,2}'::bigint[]))", row(b="3"), True),
    ("a = ANY ('{}'::integer[])", row(), False),
    ("a BETWEEN 1 AND 5", row(a="5"), True),
    ("a NOT BETWEEN 1 AND 5", row(a="6"), True),
    ("a BETWEEN SYMMETRIC 5 AND 1", row(a="3"), True),
    # arithmetic (PostgreSQL integer semantics)
    ("a / 2 = -3", row(a="-7"), True),
    ("a % 3 = -1", row(a="-7"), True),
    ("s + s > 0", row(s="100"), True),
    ("-a < '-5'::integer", row(a="6"), True),
    ("n / 3 = 0.33333333333333333333", row(n="1.0"), True),  # select_div_scale: 20 digits
    ("n / 3 = 0.3333333333333333", row(n="1"), False),
    ("n * 2 = 3.0", row(n="1.5"), True),
    ("f / 2 > 1", row(f="3"), True),
    # floats: NaN equals NaN and sorts last; -0 = 0
    ("f = 'NaN'::float8", row(f="NaN"), True),
    ("f > 1e300", row(f="NaN"), True),
    ("f = 0", row(f="-0"), True),
    ("f < 'Infinity'", row(f="1e308"), True),
    ("r > 0.1", row(r="0.1"), True),  # float4 0.1 is 0.100000001…
    ("n = 'NaN'", row(n="NaN"), True),
    ("n > 1e100", row(n="NaN"), True),
    # text, bpchar, LIKE
    ("bp = 'ab'", row(bp="ab       "), True),
    ("length(bp) = 2", row(bp="ab       "), True),
    ("bp LIKE 'ab'", row(bp="ab       "), False),
    ("(bp)::text = 'ab'", row(bp="ab       "), True),
    ("c LIKE 'a%'", row(c="abc"), True),
    ("c ~~ 'a_c'", row(c="abc"), True),
    ("c NOT LIKE 'a\\%'", row(c="a%"), False),
    ("c ILIKE 'ABC'", row(c="abc"), True),
    ("c ILIKE 'Ä'", row(c="ä"), False),  # collation "C": only ASCII folds
    ("c !~~* 'x%'", row(c="Xy"), False),
    ("c < 'b'", row(c="B"), True),  # byte order
    ("lower(c) = 'abc'", row(c="ABC"), True),
    ("c || 'x' = 'ax'", row(c="a"), True),
    ("upper(v) = 'X'", row(v="x"), True),
    ("substr(c, 2, 2) = 'bc'", row(c="abcd"), True),
    ("SUBSTRING(c FROM 1 FOR 2) = 'ab'", row(c="abcd"), True),
    ("TRIM(BOTH 'x' FROM c) = 'a'", row(c="xxaxx"), True),
    ("POSITION('b' IN c) = 2", row(c="abc"), True),
    ("\"left\"(c, -1) = 'ab'", row(c="abc"), True),
    ("starts_with(c, 'ab')", row(c="abc"), True),
    ("c = E'a\\nb'", row(c="a\nb"), True),
    ("c = 'it''s'", row(c="it's"), True),
    ("c = '日本'", row(c="日本"), True),
    # CASE and friends
    ("CASE a WHEN 1 THEN true ELSE false END", row(a="1"), True),
    ("CASE WHEN a > 1 THEN 'x' ELSE 'y' END = 'y'", row(), True),
    ("COALESCE(a, 0) = 0", row(), True),
    ("NULLIF(a, 1) IS NULL", row(a="1"), True),
    ("GREATEST(a, 1) = 1", row(), True),
    ("LEAST(a, b) = -1", row(a="-1", b="5"), True),
    # numeric functions, casts
    ("round(n, 1) = 2.5", row(n="2.45"), True),
    ("round(f) = 2", row(f="2.5"), True),
    ("abs(a) = 1", row(a="-1"), True),
    ("mod(a, 3) = 1", row(a="7"), True),
    ("(f)::integer = 2", row(f="2.5"), True),
    ("(n)::integer = 3", row(n="2.5"), True),
    ("CAST(a AS bigint) > 1", row(a="2"), True),
    ("(a)::numeric(10,2) = 2", row(a="2"), True),
    # dates, timestamps, uuid, bool
    ("d = '2024-01-01'", row(d="2024-01-01"), True),
    ("d < 'infinity'", row(d="2024-01-01"), True),
    ("d + 1 = '2024-01-02'::date", row(d="2024-01-01"), True),
    ("d < ts", row(d="2024-01-01", ts="2024-01-01 00:00:01"), True),
    ("date_trunc('month', ts) = '2024-02-01 00:00:00'", row(ts="2024-02-29 23:59:59.5"), True),
    ("tz > '2024-01-01 00:00:00+00'::timestamp with time zone",
     row(tz="2024-01-01 05:00:00+05:30"), False),
    ("tz = '2024-01-01'", row(tz="2024-01-01 05:30:00+05:30"), True),
    ("u = 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", row(u="a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), True),
    ("bo", row(bo="t"), True),
    ("bo = 'yes'", row(bo="t"), True),
    ("\"a\" = 1", row(a="1"), True),
]


@pytest.mark.parametrize("expr,values,expected", CASES)
def test_evaluate(expr, values, expected):
    flt = compile_filter(expr, COLS)
    assert flt.evaluate(values) is expected
    assert flt.matches(values) is (expected is True)


ERRORS = [  # runtime: PostgreSQL would error out the walsender
    ("a + 1 > 0", row(a="2147483647"), "integer out of range"),
    ("s * s > 0", row(s="20000"), "smallint out of range"),
    ("-b > 0", row(b="-9223372036854775808"), "bigint out of range"),
    ("a / 0 > 1", row(a="1"), "division by zero"),
    ("n % 0 > 1", row(n="1"), "division by zero"),
    ("f * 1e300 > 0", row(f="1e300"), "overflow"),
    ("(f)::integer = 1", row(f="NaN"), "integer out of range"),
    ("substr(c, 1, -1) = ''", row(c="x"), "negative substring length"),
    ("c LIKE 'a\\'", row(c="a"), "must not end with escape"),
]


@pytest.mark.parametrize("expr,values,message", ERRORS)
def test_runtime_errors(expr, values, message):
    flt = compile_filter(expr, COLS)
    with pytest.raises(FilterEvaluationError, match=message):
        flt.evaluate(values)


def test_and_short_circuits_before_an_error():
    assert compile_filter("a > 5 AND a / 0 > 1", COLS).evaluate(row(a="1")) is False


def test_strict_null_suppresses_constant_error_like_postgresql():
    assert compile_filter("NULL::int + a / 0 > 1", COLS).evaluate(row(a="1")) is None


REFUSED = [  # (expression, message fragment, line, column)
    ("zz > 1", 'column "zz" does not exist', 1, 1),
    ("a > 1 AND\n  ctid = '(0,1)'", "system column", 2, 3),
    ("now() > tz", "not immutable", 1, 1),
    ("a > 1 AND random() > 0.5", "not immutable", 1, 11),
    ("concat(c, 'x') = 'ax'", "not immutable", 1, 1),
    ("date_trunc('day', tz) = tz", "not immutable", 1, 1),
    ("tz > current_timestamp", "not immutable", 1, 6),
    ("c::int > 5", "I/O conversion", 1, 1),
    ("a::text = '5'", "I/O conversion", 1, 1),
    ("d < tz", "time zone", 1, 3),
    ("a = (SELECT 1)", "subqueries", 1, 6),
    ("EXISTS (SELECT 1)", "subqueries", 1, 1),
    ("count(*) > 1", "aggregate", 1, 1),
    ("sum(a) > 1", "aggregate", 1, 1),
    ("row_number() OVER () > 1", "window", 1, 1),
    ("myfunc(a)", "not a built-in", 1, 1),
    ("public.f(a) > 1", "user-defined", 1, 1),
    ("a::mytype > 1", "does not exist", 1, 4),
    ("c ~ 'x'", "regular expression", 1, 3),
    ("c COLLATE \"de_DE\" > 'x'", "collation", 1, 3),
    ("a", "must be type boolean", 1, 1),
    ("a = 'x'", "invalid input syntax for type integer", 1, 5),
    ("a = 1 +", "syntax error at end of input", 1, 8),
    ("a > 1/0", "division by zero", 1, 6),
    ("a = c", "operator does not exist: integer = text", 1, 3),
]


@pytest.mark.parametrize("expr,fragment,line,column", REFUSED)
def test_refused_at_compile_time(expr, fragment, line, column):
    with pytest.raises(FilterError) as info:
        compile_filter(expr, COLS)
    assert fragment in str(info.value)
    assert (info.value.line, info.value.column) == (line, column)
    assert info.value.expression == expr


def test_public_attributes():
    flt = compile_filter("a > 5 AND c = 'NSW'", COLS)
    assert isinstance(flt, RowFilter)
    assert flt.columns_used == frozenset({"a", "c"})
    assert flt.sql == "a > 5 AND c = 'NSW'"


def test_only_referenced_columns_are_converted():
    flt = compile_filter("c = 'x'", COLS)
    # an unparseable integer in a column the filter does not use is never read
    assert flt.evaluate(row(a="not a number", c="x")) is True


def test_constant_filter():
    assert compile_filter("true OR a / 0 > 1", COLS).evaluate(row()) is True
