"""Readers and writers of a route's records that are not pgrouter's, for the verify tests that
damage a topic with a plain producer and check verify against a plain consumer: records
decoded by ``json`` (pgrouter's JSON, Kafka Connect's payload) or ``fastavro`` with the writer
schema fetched from the registry's HTTP API, written back with confluent-kafka's producer,
and a topic folded as a consumer folds it (``plain_fold``)."""

from __future__ import annotations

import io
import json
import struct
import time
import urllib.request


class Codec:
    """Decodes and encodes one format's records (``json``, ``connect``, ``avro``)."""

    def __init__(self, fmt: str, registry_url: str | None = None):
        self.fmt, self.url = fmt, registry_url
        self._schemas: dict[int, object] = {}
        self._raw: dict[int, dict] = {}

    def _schema(self, sid: int):
        import fastavro

        if sid not in self._schemas:
            with urllib.request.urlopen(f"{self.url}/schemas/ids/{sid}", timeout=10) as r:
                raw = json.loads(json.loads(r.read())["schema"])
            self._raw[sid] = raw
            self._schemas[sid] = fastavro.parse_schema(raw)
        return self._schemas[sid]

    def _avro(self, data: bytes):
        import fastavro

        sid = struct.unpack(">I", data[1:5])[0]
        return fastavro.schemaless_reader(io.BytesIO(data[5:]), self._schema(sid))

    def key(self, data: bytes | None):
        if data is None:
            return None
        if self.fmt == "avro":
            return self._avro(data)
        doc = json.loads(data)
        return doc["payload"] if self.fmt == "connect" and isinstance(doc, dict) \
            and "payload" in doc else doc

    def value(self, data: bytes | None):
        if data is None:
            return None
        if self.fmt == "avro":
            return self._avro(data)
        doc = json.loads(data)
        return doc["payload"] if self.fmt == "connect" else doc

    def encode_like(self, like: bytes, env: dict) -> bytes:
        """``env`` in the schema of the record ``like`` (Connect: its schema; Avro: its id)."""
        if self.fmt == "json":
            return json.dumps(env).encode()
        if self.fmt == "connect":
            return json.dumps({"schema": json.loads(like)["schema"], "payload": env}).encode()
        import fastavro

        sid = struct.unpack(">I", like[1:5])[0]
        out = io.BytesIO()
        fastavro.schemaless_writer(out, self._schema(sid), env)
        return like[:5] + out.getvalue()

    def encode_key_like(self, like: bytes, key: dict) -> bytes:
        """``key`` in the format (and Avro schema) of the key ``like``."""
        if self.fmt == "json":
            return json.dumps(key, separators=(",", ":")).encode()
        if self.fmt == "connect":
            return json.dumps({"schema": json.loads(like)["schema"], "payload": key}).encode()
        return self.encode_like(like, key)

    def encode_retyped(self, like: bytes, env: dict, column: str, avro_type) -> bytes:
        """Avro: ``env`` in ``like``'s schema with ``column`` of ``after`` retyped, registered
        under a subject of its own (a foreign producer's schema)."""
        import fastavro

        sid = struct.unpack(">I", like[1:5])[0]
        self._schema(sid)
        raw = json.loads(json.dumps(self._raw[sid]))
        _retype(raw, column, avro_type)
        body = json.dumps({"schema": json.dumps(raw)}).encode()
        req = urllib.request.Request(f"{self.url}/subjects/damage-{sid}-{column}/versions",
                                     data=body, method="POST", headers={
                                         "Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            new = json.loads(r.read())["id"]
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(raw), env)
        return b"\x00" + struct.pack(">I", new) + out.getvalue()


def _retype(schema, column: str, avro_type) -> None:
    """Every field named ``column`` of the schema's row record (``before``'s and ``after``'s,
    defined once and named again) gets ``avro_type``."""
    def walk(node, inside):
        if isinstance(node, list):
            for n in node:
                walk(n, inside)
        elif isinstance(node, dict):
            if node.get("type") == "record":
                for f in node.get("fields", []):
                    if inside and f["name"] == column:
                        f["type"] = ["null", avro_type]
                    walk(f["type"], inside or f["name"] in ("before", "after"))
            elif isinstance(node.get("type"), (dict, list)):
                walk(node["type"], inside)
    walk(schema, False)


def read_topic(bootstrap: str, topic: str, timeout: float = 30) -> list[tuple]:
    """Every record of ``topic`` as (partition, offset, key, value), with a plain
    confluent-kafka consumer, from each partition's first offset to its end."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify-kit",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        meta = c.list_topics(topic, timeout=timeout).topics[topic]
        marks = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
                 for p in meta.partitions}
        left = {p for p, (lo, hi) in marks.items() if hi > lo}
        c.assign([TopicPartition(topic, p, marks[p][0]) for p in left])
        out = []
        deadline = time.monotonic() + timeout
        while left:
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for m in c.consume(1000, 0.5):
                if m.error() is None and m.offset() < marks[m.partition()][1]:
                    out.append((m.partition(), m.offset(), m.key(), m.value()))
                    if m.offset() + 1 >= marks[m.partition()][1]:
                        left.discard(m.partition())
        return out
    finally:
        c.close()


def produce(bootstrap: str, topic: str, records: list[tuple]) -> None:
    """(partition, key, value) records appended with a plain producer."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for partition, key, value in records:
        p.produce(topic, key=key, value=value, partition=partition)
    assert p.flush(30) == 0


def canon(key) -> str:
    return json.dumps(key, sort_keys=True)


def plain_fold(records: list[tuple], codec: Codec) -> dict[str, dict]:
    """What a consumer materializing the topic holds: per key, the latest change by
    ``(source.commit_lsn, seq)`` (a later one only when strictly newer), deletes removing
    the key, a tombstone too (a compacted topic's consumer loses what it follows), a
    truncate every row before it, unchanged TOAST columns keeping the key's
    earlier value (the JSON format's key change removing the old key)."""
    held: dict[str, tuple] = {}
    truncated = None
    for _p, _o, kb, vb in records:
        if vb is None and kb is not None:  # a tombstone: compaction drops the key's row
            key = canon(codec.key(kb))
            if held.get(key, (None, None))[1] is not None:
                held[key] = (held[key][0], None)
            continue
        env = codec.value(vb)
        if not isinstance(env, dict) or env.get("op") not in ("c", "r", "u", "d", "t"):
            continue
        src = env.get("source") or {}
        pos = (src.get("commit_lsn") or 0, src.get("seq") or 0)
        if env["op"] == "t":
            truncated = max(truncated or pos, pos)
            continue
        key = canon(codec.key(kb))
        old = held.get(key)
        if old is not None and old[0] >= pos:
            continue
        if env["op"] == "d":
            held[key] = (pos, None)
            continue
        row = dict(env.get("after") or {})
        for col in env.get("unchanged_toast") or ():
            row.pop(col, None)
            prev = old[1] if old is not None and old[1] is not None else {}
            row[col] = prev.get(col, "<lost>")
        if codec.fmt == "json" and env["op"] == "u" and env.get("before"):
            before_key = canon({c: env["before"].get(c) for c in json.loads(key)})
            if before_key != key and (held.get(before_key) or ((0, 0),))[0] < pos:
                held[before_key] = (pos, None)
        held[key] = (pos, row)
    return {k: row for k, (pos, row) in held.items()
            if row is not None and (truncated is None or pos > truncated)}
