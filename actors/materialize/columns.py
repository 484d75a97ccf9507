"""PostgreSQL column types as Spark types, and values converted from the router's JSON.

Rules: integers and floats map to Spark's numeric types, numeric keeps its precision and scale
when it has them (text otherwise), booleans to boolean, arrays to arrays of strings parsed from
PostgreSQL's array text; everything else stays PostgreSQL's text form. pyspark is imported
lazily, so the type mapping and the array parser load without a JVM.
"""

from __future__ import annotations

from router.postgres.arrays import array_items

_TEXT_TYPES = {"text", "varchar", "bpchar", "name", "char", "uuid", "json", "jsonb", "interval",
               "time", "timetz", "xml", "inet", "cidr", "macaddr", "money", "bit", "varbit"}


def spark_type_name(col: dict) -> str:
    """Spark SQL type (DDL string) of a ``ColumnSchema`` dict. Unknown types stay text: the
    router sends PostgreSQL's text form, which is lossless."""
    t = col["type"]
    if t.startswith("_"):
        elem = _scalar_type(col.get("element") or t[1:], None, None)
        return f"array<{elem}>" if elem not in ("binary",) else "string"
    return _scalar_type(t, col.get("precision"), col.get("scale"))


def _scalar_type(t: str, precision: int | None, scale: int | None) -> str:
    simple = {"int2": "smallint", "int4": "int", "int8": "bigint", "oid": "bigint",
              "float4": "float", "float8": "double", "bool": "boolean", "date": "date",
              "timestamp": "timestamp_ntz", "timestamptz": "timestamp", "bytea": "binary"}
    if t in simple:
        return simple[t]
    if t == "numeric":
        # unconstrained numeric has up to 131072 digits and NaN/±Infinity: only text is
        # lossless (decimal(38,18) would round or overflow). Constrained numeric that fits
        # Spark's 38 digits becomes a decimal; a negative scale widens it to whole numbers.
        if precision is None:
            return "string"
        s = scale or 0
        p = precision - s if s < 0 else max(precision, s)
        s = max(s, 0)
        return f"decimal({p},{s})" if p <= 38 else "string"
    return "string"


_INTEGERS = ("tinyint", "smallint", "int", "bigint")


def widens(old: str, new: str) -> bool:
    """Whether Delta's type widening turns a column of Spark type ``old`` into ``new`` without
    losing a value: a longer integer, float -> double, a decimal with at least as many digits
    before and after the point, an integer into a decimal that holds it, date -> timestamp_ntz.
    Everything else (e.g. int -> string, a narrower type) is not a widening."""
    if old == new:
        return True
    if old in _INTEGERS and new in _INTEGERS:
        return _INTEGERS.index(old) < _INTEGERS.index(new)
    if (old, new) in (("float", "double"), ("date", "timestamp_ntz")):
        return True
    dec = _decimal(new)
    if dec is None:
        return False
    if old in _INTEGERS:
        return dec[0] - dec[1] >= (3, 5, 10, 20)[_INTEGERS.index(old)]
    was = _decimal(old)
    return was is not None and dec[0] - dec[1] >= was[0] - was[1] and dec[1] >= was[1]


def _decimal(t: str) -> tuple[int, int] | None:
    if not t.startswith("decimal("):
        return None
    p, s = t[len("decimal("):-1].split(",")
    return int(p), int(s)


def parse_pg_array(text: str | None) -> list[str | None] | None:
    """PostgreSQL's text form of a one-dimensional array -> element texts (NULL -> None)."""
    return None if text is None else array_items(text)


def convert(raw, col: dict):
    """Column expression: the raw JSON text of a value (``raw``) -> its Spark value."""
    from pyspark.sql import functions as F

    dtype = spark_type_name(col)
    if dtype == "string":
        return raw
    if dtype == "binary":
        return F.unhex(F.substring(raw, 3, 1 << 30))
    if dtype.startswith("array<"):
        return _array_udf(col["name"])(raw).cast(dtype)
    if dtype.startswith(("decimal", "date", "timestamp")):
        # ±infinity dates/timestamps and NaN in numeric(p,s) have no Spark value: NULL
        return raw.try_cast(dtype)
    return raw.cast(dtype)


def _array_udf(column: str):
    """PostgreSQL's array text -> Spark array of element texts; a value that is not a
    one-dimensional array fails the batch naming the column and the value."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType

    def parse(text):
        try:
            return parse_pg_array(text)
        except ValueError as exc:
            raise ValueError(f"column {column!r}: {exc}: {text[:80]!r} (array columns are "
                             "one-dimensional Spark arrays)") from None
    return F.udf(parse, ArrayType(StringType()), useArrow=False)


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_path(warehouse: str, route: str, schema: str, table: str) -> str:
    safe = [p.replace("/", "_") for p in (route or "_", schema, table)]
    return "/".join([warehouse.rstrip("/"), *safe])


# --- the streaming job -------------------------------------------------------------------------


#: How the router writes a column's values (README "Message format"), by type OID: integer
#: types and OIDs always as JSON integers, bool always as a JSON boolean. Every other type may
#: arrive as a string (floats: "NaN"), so it is parsed as its raw JSON text.
_JSON_KINDS = {20: "bigint", 21: "bigint", 23: "bigint", 26: "bigint", 16: "boolean"}
#: the field a record that does not parse against the envelope lands in (``Materializer``
#: stops on it: a malformed record is never skipped nor half read)
CORRUPT = "_pgr_corrupt"


def image_fields(schemas) -> tuple[tuple[str, str], ...]:
    """``(name, kind)`` of every column name of ``schemas`` (ColumnSchema dicts of the known
    schemas, all tables): ``kind`` is a Spark type when every column of that name has a typed
    JSON form (``_JSON_KINDS``), else ``string`` (the value's raw JSON text). Parsing an integer
    as a number spares the JSON parser re-serialising it into a text per value."""
    kinds: dict[str, str] = {}
    for s in schemas:
        for c in s["columns"]:
            kind = _JSON_KINDS.get(c.get("type_oid"), "string")
            kinds[c["name"]] = kind if kinds.get(c["name"], kind) == kind else "string"
    return tuple(sorted(kinds.items()))


def source_fields(changelog: bool) -> tuple[tuple[str, str], ...]:
    """``(name, Spark type)`` of the ``source`` fields the job reads (changelog mode stores two
    more)."""
    used = (("schema", "string"), ("table", "string"), ("commit_lsn", "bigint"),
            ("seq", "bigint"), ("route", "string"), ("schema_id", "string"),
            ("commit_time", "string"))
    return used + ((("lsn", "bigint"), ("xid", "bigint")) if changelog else ())


def envelope_schema(fields, *, changelog: bool = False):
    """The record envelope parsed in one pass: ``before``/``after`` as structs over ``fields``
    (``image_fields``), so no image is re-serialised and parsed again, and ``CORRUPT``.
    Changelog mode keeps ``before`` as its JSON text (stored in ``_pgr_before``) and the fields
    only the changelog stores."""
    from pyspark.sql.types import (ArrayType, LongType, StringType, StructField, StructType)
    types = {"string": StringType(), "bigint": LongType()}
    source = StructType([StructField(n, types[t]) for n, t in source_fields(changelog)])
    image = image_schema(fields)
    return StructType([StructField("op", StringType()),
                       StructField("before", StringType() if changelog else image),
                       StructField("after", image), StructField("source", source),
                       StructField("unchanged_toast", ArrayType(StringType())),
                       StructField(CORRUPT, StringType())])


def image_schema(fields):
    from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType
    types = {"bigint": LongType(), "boolean": BooleanType()}
    return StructType([StructField(n, types.get(k, StringType())) for n, k in fields])
