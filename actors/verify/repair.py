"""``pgrouter verify --repair``: the running router re-sends exactly what differs, through its
backfill (watermark chunks), and verify runs again.

Rules:

* For each route and topic that differs, one backfill request per table feeding the topic,
  restricted to the keys that differ (``router.snapshot.core.Watermark.keys``): rows missing from
  the topic or different in it, and keys the topic holds that the table does not (the router
  writes a delete record for each of those at the chunk's high watermark, unless the stream
  changed the key inside the window, as for any chunk row). The request goes into the WAL
  like ``pgrouter snapshot``'s, so the router handles it in commit order, records it in its
  state topic (resumable) and logs it with the keys; verify logs the keys it asked for.
* Tables compared as multisets (no key) cannot be repaired by key: one line each, left as
  they are (``pgrouter snapshot`` cannot backfill them either).
* What no record of the router can undo is said in one line naming the keys and what to do,
  and left as it is (the second verify still shows it): extra keys the router cannot write
  (``foreign``: not the table's key columns, or, in the JSON format, values of another JSON
  type than the router writes — a foreign producer's records, which no delete of the
  router's replaces), and records past the source's WAL end (a consumer ordering by
  position keeps them over anything the router writes).
* Verify waits until the state topic says every request is done (``--wait`` seconds,
  then one line), then verifies again; the exit status is the second verify's.
"""

from __future__ import annotations

import time
import uuid

import msgspec
import trio
import trio_asyncio

from router.config.router import Config
from router.errors import ConfigError, SourceError
from router.snapshot.core import PREFIX, SnapshotState, Watermark, decode_state, encode_watermark
from router.formats.values import BOOL, FLOAT4, FLOAT8, INT2, INT4, INT8, OID

from ..kafka.compacted import read_topic
from ..services.sql import SqlSession
from ..snapshot.jobs import table_key

POLL = 0.5


class Repair(msgspec.Struct):
    """What one route's topic needs: keys to send again (missing or different) and keys to
    delete (extra), as the records' key dicts; ``tables`` feed the topic; ``beyond``: example
    keys of records past the source's WAL end, and how many (``router.verify.fold.Comparison``)."""

    route: str
    topic: str
    tables: list
    multiset: bool
    send: list
    delete: list
    fmt: str = "json"
    beyond: list = []
    beyond_count: int = 0


#: the Python type of each JSON type the JSON format writes for a column (others: str)
_JSON_TYPES = {INT2: (int,), INT4: (int,), INT8: (int,), OID: (int,), BOOL: (bool,),
               FLOAT4: (float, int, str), FLOAT8: (float, int, str)}


def writable(k, key: tuple, relation, fmt: str) -> bool:
    """Whether the router can write a record keyed ``k`` (a topic key's dict) for a table
    keyed by the columns ``key``: the same columns, and in the JSON format each value of the
    JSON type the router writes for its column (str for the text forms)."""
    if not isinstance(k, dict) or set(k) != set(key):
        return False
    if fmt != "json":
        return True
    oids = {c.name: c.type_oid for c in relation.columns}
    for c in key:
        v = k[c]
        want = _JSON_TYPES.get(oids.get(c), (str,))
        if v is None or v.__class__ not in want:
            return False
    return True


async def request(cfg: Config, slot: str, repairs: list[Repair], say,
                  metrics=None) -> list[tuple[str, str, str]]:
    """Writes the requests to the router streaming ``slot``; returns (request id, route,
    table) of each. ``metrics`` (``VerifyMetrics``) counts each request pending as soon as it
    is written, before it is said: a scrape after the line sees it."""
    if not cfg.source.messages:
        raise ConfigError("repairs are backfills, which need logical messages (the "
                          "watermarks)", path="source.messages")
    asked = []
    async with trio_asyncio.open_loop():
        async with await SqlSession.connect(cfg.source.dsn) as sql:
            for rep in repairs:
                if rep.multiset:
                    say(f"route {rep.route} topic {rep.topic}: tables without a key "
                        f"({', '.join(t.name for t in rep.tables)}) cannot be repaired by "
                        "key: left as they are")
                    continue
                if rep.beyond_count:
                    say(f"route {rep.route} topic {rep.topic}: {rep.beyond_count} record(s) "
                        "past the source's WAL end (e.g. "
                        f"{msgspec.json.encode(rep.beyond[:3]).decode()}): not written by "
                        "the router; a consumer ordering by position keeps them over "
                        "anything it writes, so no repair can replace them: delete the "
                        f"topic and run pgrouter snapshot --route {rep.route} (every "
                        "consumer reads the topic again)")
                foreign = list(rep.delete)
                for table in rep.tables:
                    key, _types, _at = await table_key(sql, table)
                    ours = [k for k in rep.delete
                            if writable(k, key, table.relation, rep.fmt)]
                    foreign = [k for k in foreign if k not in ours]
                    keys = tuple(dict.fromkeys(
                        tuple(k.get(c) for c in key) for k in rep.send + ours
                        if set(key) <= set(k)))
                    if not keys:
                        continue
                    rid = uuid.uuid4().hex
                    mark = Watermark("request", slot, chunk=rid,
                                     routes=(rep.route,), tables=(table.name,), keys=keys)
                    await sql.execute("select pg_logical_emit_message(true, $1, $2::text)",
                                      PREFIX, encode_watermark(mark).decode())
                    if metrics is not None:
                        metrics.pending += 1
                    say(f"repair requested: request={rid} route={rep.route} "
                        f"table={table.name} keys={msgspec.json.encode(keys).decode()} "
                        f"(to send again: {len(rep.send)}, to delete: {len(rep.delete)})")
                    asked.append((rid, rep.route, table.name))
                if foreign:
                    say(f"route {rep.route} topic {rep.topic}: {len(foreign)} extra key(s) "
                        "the router cannot write (not its key columns, or values of another "
                        "JSON type; e.g. "
                        f"{msgspec.json.encode(foreign[:3]).decode()}): a foreign producer's "
                        "records, which no delete of the router's replaces: write a delete "
                        "record under each of these keys, or delete the topic and run "
                        f"pgrouter snapshot --route {rep.route}")
    return asked


def wait_done(cfg: Config, slot: str, asked: list[tuple[str, str, str]],
              timeout: float) -> None:
    """Blocks until the state topic records every request done (a worker thread's)."""
    k = cfg.kafka
    want = {(rid, route, table) for rid, route, table in asked}
    deadline = time.monotonic() + timeout
    while True:
        done = set()
        for key, value in read_topic(k.bootstrap_servers, dict(k.settings),
                                     cfg.snapshot.state_topic):
            p: SnapshotState | None = decode_state(value)
            if p is not None and p.kind == "backfill" and p.slot == slot \
                    and p.state == "done":
                done.add((p.request, p.route, p.table))
        if want <= done:
            return
        if time.monotonic() > deadline:
            left = ", ".join(f"{route}/{table}" for _, route, table in sorted(want - done))
            raise SourceError(f"timed out after {timeout:g} s waiting for the router to "
                              f"finish the repair backfills ({left}): is it running? "
                              "(--wait N)")
        time.sleep(POLL)


async def wait_repaired(cfg: Config, slot: str, asked, timeout: float) -> None:
    await trio.to_thread.run_sync(wait_done, cfg, slot, asked, timeout)
