"""One route's topics against its tables (``actors.verify.run`` plans and takes the
snapshot): the topic folded, the bucket digests compared where there are some, the source rows
read and compared.

Rules:

* Memory is bounded by ``max_keys``: a topic of a table of more rows than that (the planner's
  estimate, else a count) is verified in passes, each folding and comparing only the keys of
  its part (by bucket where digests are compared, else by a hash of the key); each pass reads
  the topic again. Keyless tables (multisets) are verified in one pass.
* Topics of keyed tables in the JSON format, and in the Connect and Avro formats when every
  column's type renders alike on both sides (``actors.verify.digests.digestible``): the
  source's bucket digests are computed (once, while the topic is read) and only the rows of buckets that differ are read; a differing bucket
  of more than ``split_rows`` rows is split into sub-buckets whose digests both sides compute
  again, and only the rows of differing sub-buckets are read (bisect). Other topics have
  every row read and compared.
* The cyclic garbage collector is off while a topic is compared, not only while it is read
  (``fold_topic``): turned on between the two, its next pass walked every row the fold
  holds, hundreds of thousands of tuples, none of them cyclic.
"""

from __future__ import annotations

import gc
import time
import zlib

import trio

from router.config.router import Config
from router.formats.envelope import TxContext
from router.verify.fold import Comparer, Comparison, TopicFold, key_of, salted
from router.verify.digests import (bucket_in, bucket_of, bucket_sums, buckets_for, differing,
                                  digester, key_text, sub_sums, subs_for, to_split)

from ..pipeline.formats import record_format
from ..snapshot.reader import TableReader
from ..snapshot.tables import ident
from .digests import copy_sums, digestible, rows_select, sql_sums
from .point import wal_end
from .topic import Decoder, fold_topic


#: a differing bucket of more rows than this is bisected (``_Topic._narrow``)
SPLIT_ROWS = 10_000


async def compare_target(cfg: Config, target, reader: TableReader, cut: int, examples: int,
                         progress, repairs: list | None, max_keys: int,
                         split_rows: int = SPLIT_ROWS, metrics=None) -> list[Comparison]:
    decoder = Decoder(cfg.kafka.registry)
    reshape = record_format(cfg)
    tx = TxContext(xid=0, commit_lsn=cut - 1, end_lsn=cut, commit_time=0)
    out = []
    for topic, tables in target.topics.items():
        started = time.monotonic()
        result = Comparison(target.route, topic, sorted({t.name for t in tables}))
        job = _Topic(cfg, target, topic, tables, reader, decoder, reshape, tx, progress,
                     split_rows, metrics)
        send: list = []
        delete: list = []
        collecting = gc.isenabled()
        gc.disable()  # the topic's rows are tuples by the million, none of them cyclic
        try:
            await job.run(result, cut, examples, repairs is not None, max_keys, send, delete)
        finally:
            if collecting:
                gc.enable()
        result.seconds = round(time.monotonic() - started, 3)
        out.append(result)
        if metrics is not None:
            metrics.result(result)
        if repairs is not None and not result.ok:
            from .repair import Repair  # --repair only: its modules load then
            repairs.append(Repair(target.route, topic, tables, target.keyless(topic), send,
                                  delete, reshape.name, result.beyond_keys,
                                  result.beyond))
    return out


class _Topic:
    def __init__(self, cfg, target, topic, tables, reader, decoder, reshape, tx, progress,
                 split_rows: int = SPLIT_ROWS, metrics=None):
        self.metrics = metrics
        self.result_notes: list[str] = []
        self.cfg, self.target, self.topic, self.tables = cfg, target, topic, tables
        self.reader, self.decoder, self.reshape, self.tx = reader, decoder, reshape, tx
        self.progress = progress
        self.split_rows = split_rows
        self.schemas = {t.name: next(p.encoder.schema for p in target.rows.router.plans_for(
            t.relation) if p.topic == topic) for t in tables}
        self.keyless = target.keyless(topic)
        self.fmt = reshape.name
        self.by_buckets = not self.keyless and all(
            s.key_columns and set(s.key_columns) <= {c.name for c in s.columns}
            and digestible(self.fmt, s) for s in self.schemas.values())

    async def run(self, result: Comparison, cut: int, examples: int, collect: bool,
                  max_keys: int, send: list, delete: list) -> None:
        rows = await _rows(self.reader, self.tables)
        passes = 1 if self.keyless else max(1, -(-rows // max(1, max_keys)))
        buckets = max(buckets_for(rows), passes) if self.by_buckets else 0
        result.passes = passes
        self.result_notes = result.notes
        source: dict[int, list] = {}
        for p in range(passes):
            part = None
            if passes > 1 and self.by_buckets:
                part = (lambda key, p=p: bucket_of(key_text(key), buckets) % passes == p)
            elif passes > 1:
                part = (lambda key, p=p: zlib.crc32(key_of(key)) % passes == p)
            fold = TopicFold(cut, digester(buckets) if self.by_buckets else salted, part)
            async with trio.open_nursery() as both:  # PostgreSQL's digests meanwhile
                both.start_soon(self._read_topic, fold)
                if self.by_buckets and p == 0:
                    for t in self.tables:
                        await copy_sums(self.reader.sql, t, self.schemas[t.name],
                                        self.target.filters[t.name], buckets, source,
                                        self.fmt)
            comparer = Comparer(result, fold, self.target.actions, examples, collect)
            differ, codes, subs = None, [], 0
            if self.by_buckets:
                mine = {b: v for b, v in source.items() if b % passes == p}
                differ, codes, subs = await self._narrow(comparer, buckets, mine)
            await self._read_rows(comparer, buckets, differ, codes, subs)
            comparer.finish()
            send.extend(comparer.send)
            delete.extend(comparer.delete)
            if passes > 1:
                self.progress(f"route {self.target.route}: topic {self.topic}: pass {p + 1} "
                              f"of {passes} done", force=True)

    async def _read_topic(self, fold: TopicFold) -> None:
        cfg, topic = self.cfg, self.topic

        def report(n):
            self.progress(f"route {self.target.route}: topic {topic}: {n} records read")
            if self.metrics is not None:
                self.metrics.records_read(self.target.route, topic, n)

        await trio.to_thread.run_sync(lambda: fold_topic(
            cfg.kafka.bootstrap_servers, dict(cfg.kafka.settings), topic, fold, self.decoder,
            report, self.keyless, library=cfg.kafka.client,
            wal_end=lambda: wal_end(cfg.source.dsn)))
        for partition, first in sorted(fold.starts.items()):
            note = (f"partition {partition} starts at offset {first}: its oldest records were "
                    "deleted (retention or delete-records); compared as a consumer reading "
                    "from the start reads it")
            if note not in self.result_notes:
                self.result_notes.append(note)

    async def _narrow(self, comparer: Comparer, buckets: int,
                      source: dict[int, list]) -> tuple[set[int], list[int], int]:
        """The tables' bucket digests (``source``, computed by PostgreSQL) against the folded
        topic's: the rows of equal buckets count as matching and leave the comparison.
        Differing buckets of more than ``split_rows`` rows (``--split-rows``) are split into
        sub-buckets whose digests are computed again on both sides (bisect). Returns the
        buckets to read whole, the sub-buckets to read (``bucket * subs + sub``), ``subs``."""
        sums = bucket_sums(comparer.topic, buckets)
        differ = differing(source, sums)
        split = to_split(differ, source, sums, self.split_rows)
        equal = sum(n for b, (n, _h) in source.items() if b not in differ)
        subs, codes, keys = 0, set(), {}
        if split:
            subs = subs_for(source, sums, split, max(1, self.split_rows // 20))
            mine: dict[int, list] = {}
            for t in self.tables:
                await sql_sums(self.reader.sql, t, self.schemas[t.name],
                               self.target.filters[t.name], buckets, mine, subs,
                               sorted(split), self.fmt)
            theirs, keys = sub_sums(comparer.topic, split, subs)
            codes = differing(mine, theirs)
            equal += sum(n for c, (n, _h) in mine.items() if c not in codes)
        whole = differ - split
        r = comparer.result
        r.buckets = buckets
        r.buckets_differing += len(differ)
        r.buckets_split += len(split)
        topic = comparer.topic
        comparer.skip_equal(equal, (lambda k: bucket_in(topic[k]) in whole or keys.get(k) in codes)
                            if whole or codes else None)
        return whole, sorted(codes), subs

    async def _read_rows(self, comparer: Comparer, buckets: int, differ: set | None,
                         codes: list[int], subs: int) -> None:
        """The source rows (of the buckets ``differ`` and the sub-buckets ``codes`` when
        digests were compared) into ``comparer``."""
        counted = [0]
        target, decoder = self.target, self.decoder
        for table in self.tables:
            multiset = (table.relation.namespace, table.relation.name) in target.multiset

            async def deliver(batch, table=table, multiset=multiset):
                chunk = target.rows.chunk(table.relation, batch, self.tx, 0)
                for _topic, key, value, _headers in await _encoded(self.reshape, chunk):
                    env = decoder.value(value)
                    if env is not None:
                        comparer.row(None if multiset else decoder.key(key),
                                     env.get("after") or {})
                counted[0] += len(batch)
                self.progress(f"route {target.route}: topic {self.topic}: {counted[0]} "
                              "source rows compared")

            if differ is None:
                await self.reader.copy(table.select(), deliver, f"reading {table.name}")
            elif differ or codes:
                select = rows_select(table, self.schemas[table.name],
                                     target.filters[table.name], buckets, subs, self.fmt)
                args = (sorted(differ), codes) if subs else (sorted(differ),)
                await self.reader.copy(select, deliver, f"reading {table.name}", args)


async def _rows(reader: TableReader, tables) -> int:
    """About how many rows the tables hold (the planner's estimate, else a count)."""
    n = sum([await reader.estimate(t.table) for t in tables])
    if n > 0:
        return n
    for t in tables:
        n += await reader.sql.fetchval(f"SELECT count(*) FROM ONLY {ident(t.table[0])}."
                                       f"{ident(t.table[1])}")
    return n


async def _encoded(reshape, chunk) -> list:
    """The chunk's records as the sink writes them (Avro: schemas registered, as the sink
    does; the registry hands back the ids the router's records carry)."""
    if not reshape.registers:  # JSON, Connect: no schema to register (Avro loads only for Avro)
        return reshape(chunk)
    from router.formats.avro import SchemasNeeded
    while True:
        try:
            return reshape(chunk)
        except SchemasNeeded as need:
            await trio.to_thread.run_sync(reshape.register, need.subjects)
