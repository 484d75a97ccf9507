"""Transaction metadata: a BEGIN and an END record per source transaction, on one topic.

Debezium's transaction metadata shape, so a consumer can reassemble whole transactions
across topics::

    {"status": "BEGIN"|"END", "id": "<xid>:<commit_lsn>", "event_count": n|null,
     "data_collections": [{"data_collection": topic, "event_count": n}, …]|null,
     "ts_ms": commit time, "source": {db, xid, lsn, commit_lsn, end_lsn, commit_time,
     origin, origin_lsn}}

Rules:

* Written only for transactions that produce at least one record (like Debezium, which
  opens a transaction at its first event): BEGIN goes in front of the first record, END
  after the last, in the same chunks, so they share the transaction's ticket and are
  confirmed with it.
* END counts the records written to each topic (every route's records, logical messages
  included; tombstones not: they are no change events), in the order topics were first
  written.
* The key is ``{"id": …}``; the topic has one partition (route ``""`` settings), so BEGIN/END
  records are in commit order. A transaction re-sent after a restart gets identical records.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import msgspec

from ..formats.envelope import TxContext
from .change_router import RoutedChunk

_encode = msgspec.json.Encoder().encode


def transaction_id(xid: int, commit_lsn: int) -> str:
    return f"{xid}:{commit_lsn}"


class TransactionMeta:
    def __init__(self, topic: str, *, db: str, ignore: frozenset[str] = frozenset()):
        self.topic = topic
        self.db = db
        #: topics whose records are pgrouter's own bookkeeping (the definitions topic): not
        #: counted, and a transaction with only such records gets no BEGIN/END
        self.ignore = ignore
        self._announced = False

    def _record(self, status: str, tx: TxContext, counts: dict[str, int] | None) -> tuple:
        tid = transaction_id(tx.xid, tx.commit_lsn)
        value = {
            "status": status, "id": tid,
            "event_count": sum(counts.values()) if counts is not None else None,
            "data_collections": ([{"data_collection": t, "event_count": n}
                                  for t, n in counts.items()] if counts is not None else None),
            "ts_ms": tx.ts_ms,
            "source": {"db": self.db, "xid": tx.xid, "lsn": tx.commit_lsn,
                       "commit_lsn": tx.commit_lsn, "end_lsn": tx.end_lsn,
                       "commit_time": tx.commit_time_iso, "origin": tx.origin,
                       "origin_lsn": tx.origin_lsn},
        }
        headers = [("pgrouter.commit_lsn", str(tx.commit_lsn).encode()),
                   ("pgrouter.status", status.encode())]
        return (self.topic, _encode({"id": tid}), _encode(value), headers)

    def wrap(self, txn, chunks: Iterable[RoutedChunk]) -> Iterator[RoutedChunk]:
        """The transaction's chunks with BEGIN put before its first record and END after
        its last (``txn`` is the ``Transaction`` the chunks were routed from)."""
        tx = None
        counts: dict[str, int] = {}
        ignore = self.ignore
        for chunk in chunks:
            records = chunk.records
            if ignore and records and all(r[0] in ignore for r in records):
                if chunk.last and tx is not None:
                    records.append(self._record("END", tx, counts))
                yield chunk
                continue
            if records:
                if tx is None:
                    tx = TxContext(xid=txn.xid, commit_lsn=txn.commit_lsn, end_lsn=txn.end_lsn,
                                   commit_time=txn.commit_time, origin=txn.origin_name,
                                   origin_lsn=txn.origin_lsn)
                    records.insert(0, self._record("BEGIN", tx, None))
                    if not self._announced:
                        self._announced = True
                        chunk.new_topics = [*chunk.new_topics, (self.topic, "")]
                    it = iter(records)
                    next(it)
                else:
                    it = iter(records)
                for rec in it:
                    topic = rec[0]
                    # a tombstone (router.formats.tombstones) is no change event: a reader counting
                    # a transaction's records (the applier) skips it, as Debezium counts none
                    if topic not in ignore and rec[2] is not None:
                        counts[topic] = counts.get(topic, 0) + 1
            if chunk.last and tx is not None:
                records.append(self._record("END", tx, counts))
            yield chunk
