"""Avro topics (the router's ``[kafka] format = "avro"``): records in the Confluent wire format,
decoded in the JVM by Spark's ``from_avro`` with their writer schema, fetched from the schema
registry by the id the record names, into the rows the JSON path makes.

Rules:

* A value whose first byte is 0x00 (and that has the 4 bytes of an id) is Avro; a JSON record
  starts with ``{``, so a topic may hold both. The schema id is bytes 2–5, big-endian. The
  driver fetches each id once per job (``RegistrySchemas``, over ``RegistryClient``); a batch's
  records are decoded id by id, each id one table layout on one topic.
* Column types still come from the schema topic (``source.schema_id``), so a column has the
  Spark type the JSON path gives it (``columns.spark_type_name``); ``value`` converts the Avro
  value to it: VariableScaleDecimal and decimals of more than 38 digits to their exact text,
  time to PostgreSQL's text, bytea[] to PostgreSQL's array text, the rest by a cast.
* A column whose name is not a valid Avro name has a field of another name that names it in
  its ``pgrouter.column`` property (``router.formats.avro``): the images' fields are named as the
  columns again.
* A key change (the delete ``delete_old`` of the old key and the create ``create_new`` of the
  new one, which keeps the old row in ``before``) is one update again, as the JSON format
  writes it: the create becomes the update, the delete is dropped. Both sit at the update's
  position, so a batch holding either half is exact.
* Columns named in ``unchanged_toast`` are NULL in ``after`` (their placeholder is dropped), as
  the JSON format leaves them out.
* A schema that is not the change envelope (logical decoding messages) is skipped, as JSON
  messages are. A record that does not decode with its schema is not a change record
  (``CORRUPT``: the job stops naming it); so are Avro records when the config has no
  ``[kafka.registry]``, and a schema id the registry does not have.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from .columns import CORRUPT, source_fields, spark_type_name
from .settings import MaterializeError, RegistrySettings

AVRO = "_pgr_avro"  # the value of an Avro record (NULL for JSON records)
RID = "_pgr_rid"  # its schema's registry id
#: the envelope fields that make a schema pgrouter's change record
_ENVELOPE = frozenset({"before", "after", "source", "op"})
#: seconds between the attempts to fetch a schema from a registry that does not answer
_RETRY_S = (1, 2, 4)
#: the field property naming the column of a field whose name is not the column's
#: (``router.formats.avro.COLUMN_PROP``; the job does not import the router's Avro writer)
COLUMN_PROP = "pgrouter.column"


@dataclass(frozen=True)
class Reader:
    """How the records of one registry id are decoded: the schema ``from_avro`` reads them
    with, and the columns of the row fields named otherwise (field -> column)."""

    schema: str
    columns: dict


def wire_columns(value):
    """``(registry id, Avro value)`` columns of a Kafka value: NULL both unless it is Avro in
    the Confluent wire format (0x00, a 4-byte id, the datum)."""
    from pyspark.sql import functions as F

    magic = (F.substring(value, 1, 1) == F.unhex(F.lit("00"))) & (F.length(value) >= 5)
    rid = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
    return F.when(magic, rid), F.when(magic, value)


def reader(text: str) -> Reader | None:
    """How to decode a registry schema's records: with the writer's schema, less the logical
    types Spark would read into a type no column has (``time-micros``: Spark's TIME cannot hold
    PostgreSQL's 24:00:00; decimals of more than Spark's 38 digits), which stay their long, int
    or bytes. None: not pgrouter's change envelope (a message schema)."""
    schema = json.loads(text)
    fields = schema.get("fields", ()) if isinstance(schema, dict) else ()
    if not _ENVELOPE <= {f.get("name") for f in fields}:
        return None
    # the row record is defined in ``before`` (and named in ``after``)
    [before] = [f["type"] for f in fields if f.get("name") == "before"]
    rows = [t for t in (before if isinstance(before, list) else [before]) if isinstance(t, dict)]
    columns = {f["name"]: f[COLUMN_PROP] for f in rows[0]["fields"] if COLUMN_PROP in f}
    _plain(schema)
    return Reader(json.dumps(schema), columns)


def _plain(t) -> None:
    if isinstance(t, list):
        for u in t:
            _plain(u)
        return
    if not isinstance(t, dict):
        return
    logical = t.get("logicalType")
    if logical in ("time-micros", "time-millis") or (logical == "decimal"
                                                      and t.get("precision", 0) > 38):
        del t["logicalType"]
    kind = t.get("type")
    if kind == "record":
        for f in t.get("fields", ()):
            _plain(f.get("type"))
    elif kind == "array":
        _plain(t.get("items"))
    elif isinstance(kind, (dict, list)):
        _plain(kind)


class RegistrySchemas:
    """The reader schema of each registry id, fetched once per job (in the driver)."""

    def __init__(self, registry: RegistrySettings | None, *, sleep=time.sleep):
        self.registry = registry
        self.sleep = sleep
        self._client = None
        self._readers: dict[int, Reader | None] = {}

    def reader(self, rid: int, at) -> Reader | None:
        """``at``: the first record naming ``rid`` (topic, partition, offset), for errors."""
        if rid in self._readers:
            return self._readers[rid]
        where = f"record at {at.topic} partition {at.partition} offset {at.offset}"
        if self.registry is None:
            raise MaterializeError(f"{where} is Avro (Confluent wire format, schema id {rid}) "
                                   "and the config has no [kafka.registry]: give it the url of "
                                   "the registry the router writes to")
        text = self._fetch(rid, where)
        try:
            found = reader(text)
        except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
            raise MaterializeError(f"schema id {rid} of schema registry {self._client.where} "
                                   f"(named by the {where}) is not an Avro schema: {exc}") from exc
        self._readers[rid] = found
        return found

    def _fetch(self, rid: int, where: str) -> str:
        # the registry client and the router's error tree are imported only for Avro topics
        from actors.kafka.registry import RegistryClient
        from router.errors import PgRouterError, is_retryable

        if self._client is None:
            self._client = RegistryClient(self.registry)
        for attempt, pause in enumerate((*_RETRY_S, None)):
            try:
                return self._client.schema(rid)
            except PgRouterError as exc:
                if pause is None or not is_retryable(exc):
                    raise MaterializeError(f"schema id {rid} of the {where}: {exc}") from None
                self.sleep(pause)
        raise AssertionError("unreachable")


def decode(env, rid: int, how: Reader, *, changelog: bool):
    """The records of ``env`` with registry id ``rid`` as the JSON path's parsed records
    (``op``, ``before``, ``after``, ``source``, ``unchanged_toast``, ``CORRUPT``, ``_pgr_at``,
    ``RID``), their images typed by Avro (``value`` converts them)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.types import BinaryType, StringType

    # CORRECTED: days and microseconds are the proleptic Gregorian calendar's, as the router
    # writes them (the default refuses dates before 1582)
    decoded = from_avro(F.expr(f"substring({AVRO}, 6)"), how.schema,
                        {"mode": "PERMISSIVE", "datetimeRebaseMode": "CORRECTED"})
    raw = env.filter(F.col(RID) == rid).select(decoded.alias("r"), "_pgr_at", AVRO)
    r = F.col("r")
    ok = r.getField("op").isNotNull()  # PERMISSIVE: a record that does not decode is all NULL
    key_change = F.coalesce(r.getField("key_change"), F.lit(""))
    toast = r.getField("unchanged_toast")
    image = raw.schema["r"].dataType["after"].dataType
    # only string and bytes columns carry the unchanged-TOAST placeholder; the others are NULL
    placeholders = {f.name for f in image.fields if isinstance(f.dataType, (StringType,
                                                                             BinaryType))}

    def row(img, unchanged=None):
        """``img`` with its fields named as the columns; with ``unchanged``, those of its
        columns NULL."""
        out = []
        for f in image.fields:
            column = how.columns.get(f.name, f.name)
            v = img.getField(f.name)
            if unchanged is not None and f.name in placeholders:
                v = F.when(F.array_contains(unchanged, column), F.lit(None).cast(f.dataType)) \
                     .otherwise(v)
            out.append(v.alias(column))
        return F.when(img.isNotNull(), F.struct(*out))

    before, after = r.getField("before"), r.getField("after")
    if how.columns:
        before = row(before)
    if placeholders:
        after = F.when(F.size(toast) > 0, row(after, toast)).otherwise(
            row(after) if how.columns else after)
    elif how.columns:
        after = row(after)
    source = F.struct(*[r.getField("source").getField(n).alias(n)
                        for n, _ in source_fields(changelog)])
    return (raw.filter(key_change != "delete_old")
            .select(F.when(key_change == "create_new", F.lit("u")).otherwise(r.getField("op"))
                    .alias("op"), before.alias("before"), after.alias("after"),
                    source.alias("source"), toast.alias("unchanged_toast"),
                    F.when(~ok, F.hex(F.substring(AVRO, 1, 64))).alias(CORRUPT), "_pgr_at",
                    F.lit(rid).alias(RID)))


# --- values ----------------------------------------------------------------------------------

def value(v, col: dict, have):
    """Column expression: the Avro value ``v`` (Spark type ``have``) of a column
    (``ColumnSchema`` dict) as the JSON path stores it."""
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StructType

    dtype = spark_type_name(col)
    if isinstance(have, StructType):  # VariableScaleDecimal: unconstrained numeric
        return _decimal_text(v.getField("value"), v.getField("scale"))
    if dtype == "string" and isinstance(have, BinaryType):  # numeric(p,s), p > 38
        return _decimal_text(v, max(col.get("scale") or 0, 0))
    if dtype == "string" and isinstance(have, (IntegerType, LongType)):  # time
        return _time_text(v, millis=isinstance(have, IntegerType))
    if isinstance(have, ArrayType):
        from pyspark.sql import functions as F

        elem = have.elementType
        if dtype == "string":  # bytea[]: the JSON path keeps PostgreSQL's text form
            return F.concat(F.lit("{"), F.array_join(F.transform(v, lambda e: F.coalesce(
                F.concat(F.lit('"\\\\x'), F.lower(F.hex(e)), F.lit('"')), F.lit("NULL"))),
                ","), F.lit("}"))
        if isinstance(elem, StructType):
            v = F.transform(v, lambda e: _decimal_text(e.getField("value"), e.getField("scale")))
        elif isinstance(elem, (IntegerType, LongType)) and dtype == "array<string>":
            v = F.transform(v, lambda e: _time_text(e, millis=isinstance(elem, IntegerType)))
    return v.cast(dtype)


def _decimal_text(unscaled, scale):
    """The exact text of a decimal (``unscaled``: its two's-complement big-endian bytes, of
    any length; ``scale``: an int or an int column), as PostgreSQL prints it: no exponent, the
    scale's digits after the point. The digits come from ``java.math.BigInteger`` (commons-lang3's
    ``NumberUtils.createBigInteger``, on Spark's classpath), so no length is too long."""
    from pyspark.sql import functions as F

    h = F.hex(unscaled)
    n = F.length(h)
    negative = F.substring(h, 1, 1) >= F.lit("8")
    # a negative number's magnitude is its bits inverted, plus one: the last hex digit that is
    # not F goes up by one, the F's after it become 0
    inverted = F.translate(h, "0123456789ABCDEF", "FEDCBA9876543210")
    fs = F.length(F.regexp_extract(inverted, "F*$", 0))
    magnitude = F.when(negative, F.concat(
        F.substring(inverted, F.lit(1), n - fs - 1),
        F.translate(F.substring(inverted, n - fs, F.lit(1)), "0123456789ABCDE", "123456789ABCDEF"),
        F.repeat(F.lit("0"), fs))).otherwise(h)
    digits = F.call_function("reflect", F.lit("org.apache.commons.lang3.math.NumberUtils"),
                             F.lit("createBigInteger"), F.concat(F.lit("0x"), magnitude))
    scale = F.lit(scale) if isinstance(scale, int) else scale
    padded = F.lpad(digits, F.greatest(F.length(digits), scale + 1), F.lit("0"))
    whole = F.length(padded) - scale
    text = F.when(scale > 0, F.concat(F.substring(padded, F.lit(1), whole), F.lit("."),
                                      F.substring(padded, whole + 1, scale))).otherwise(padded)
    return F.when(unscaled.isNotNull(), F.concat(F.when(negative, F.lit("-")).otherwise(F.lit("")),
                                                 text))


def _time_text(v, *, millis: bool):
    """Microseconds (milliseconds) since midnight as PostgreSQL prints a time: HH:MM:SS and the
    fraction without trailing zeros (24:00:00 included)."""
    from pyspark.sql import functions as F

    us = v.cast("long") * (1000 if millis else 1)

    def two(x):
        return F.lpad(x.cast("string"), 2, "0")
    frac = us % 1_000_000
    return F.concat(
        two(F.floor(us / 3_600_000_000)), F.lit(":"), two(F.floor(us / 60_000_000) % 60),
        F.lit(":"), two(F.floor(us / 1_000_000) % 60),
        F.when(frac > 0, F.concat(F.lit("."), F.regexp_replace(
            F.lpad(frac.cast("string"), 6, "0"), "0+$", ""))).otherwise(F.lit("")))
