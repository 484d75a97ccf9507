"""Short transactions in one step: Begin, row changes, Commit → a ``Transaction``.

An OLTP source sends mostly transactions of one to a few rows; taking each through the
assembler's message handlers (a Begin object, an open ``ChangeBuffer``, a Commit object, the
buffer's release) costs more than its rows. ``take_short`` turns the run of such transactions
at the start of a batch into ``Transaction`` events directly, with the same outcome as the
long way (``TransactionAssembler.feed``): the same fields, the same changes.

Rules:

* Only the plain case: Begin, then Insert/Update/Delete only (no Origin, Relation, Type,
  Message, Truncate), then a Commit whose LSN is the Begin's final LSN, all in this batch,
  outside any open transaction or stream block. Anything else stops the run at that
  transaction's Begin; the caller feeds it the long way (which also raises the precise error
  for a malformed message).
* Short means at most ``MAX_ROWS`` rows: a longer transaction is left to the long way after
  that many (what was decoded of it is decoded again there, so a large transaction costs
  this at most once). A transaction whose rows pass ``budget`` (what the memory limit
  leaves) is left to the long way too, which spills.
* ``router._native.take_short`` does the same in C; this module is the reference.
"""

from __future__ import annotations

import struct

from .changes import CHANGE_OVERHEAD, VALUE_OVERHEAD, Change, Changes, row_change, row_size
from ..native import NATIVE

_BEGIN = struct.Struct("!QqI")  # final LSN, commit time, xid
_COMMIT = struct.Struct("!BQQq")  # flags, commit LSN, end LSN, commit time
_B, _C = ord("B"), ord("C")
_ROWS = frozenset(b"IUD")
_NO_ABORTS: frozenset = frozenset()
#: rows a short transaction has at most
MAX_ROWS = 64


def take_short(messages: list, i: int, relations: dict, budget: int, events: list,
               transaction, decode) -> int:
    """Appends a ``transaction(...)`` for each complete short transaction from ``messages[i]``
    on; returns the index of the first message not taken. ``relations``: relation id →
    Relation (``RelationCache.by_id``); ``decode``: ``Decoder.decode`` (for the rows)."""
    n = len(messages)
    while i < n:
        begin = messages[i][1]
        if len(begin) != 21 or begin[0] != _B:
            break
        final_lsn, _, xid = _BEGIN.unpack_from(begin, 1)
        changes: list = []
        used = 0
        j = i + 1
        last = min(n, i + 1 + MAX_ROWS)
        while j < last:
            lsn, payload = messages[j]
            if not payload or payload[0] not in _ROWS:
                break
            msg = decode(payload)
            rel = relations.get(msg.relation_id)
            if rel is None or msg.xid is not None:
                return i
            change = row_change(lsn, msg, rel)
            changes.append(change)
            used += row_size(change, len(payload))
            j += 1
        if j >= last or used > budget:
            break
        commit = messages[j][1]
        if len(commit) != 26 or commit[0] != _C:
            break
        _, commit_lsn, end_lsn, commit_time = _COMMIT.unpack_from(commit, 1)
        if commit_lsn != final_lsn:
            break
        count = len(changes)
        events.append(transaction(xid, final_lsn, commit_lsn, end_lsn, commit_time, None, None,
                                  None, Changes(changes, (), None, (), _NO_ABORTS, count),
                                  count))
        i = j + 1
    return i



def bind_short(transaction, decode, native_rows: bool):
    """``take_short(messages, i, relations, budget, events)`` for one batch: in C when the
    decoder's rows are read there (``native_rows``), else in Python with ``decode``."""
    native = getattr(NATIVE, "take_short", None) if native_rows else None
    if native is not None:
        return lambda messages, i, relations, budget, events: native(
            messages, i, relations, budget, events, transaction, Changes, Change,
            CHANGE_OVERHEAD, VALUE_OVERHEAD, MAX_ROWS)
    return lambda messages, i, relations, budget, events: take_short(
        messages, i, relations, budget, events, transaction, decode)


def feed_row(buf, messages: list, i: int, decode, assembler) -> tuple[int, int, int]:
    """``router._native.feed_rows`` for one message in Python, inside an open transaction
    (``buf``): (i + 1, bytes, count) when it was a row change and is taken, (i, 0, 0) when it
    must be fed the long way (``assembler.feed``)."""
    lsn, payload = messages[i]
    if not payload or payload[0] not in _ROWS:
        return i, 0, 0
    msg = decode(payload)
    if msg.xid is not None:  # cannot be (Stream Start inside a transaction is refused)
        assembler.feed(lsn, msg)
        return i + 1, 0, 0
    change = row_change(lsn, msg, assembler.relations.get(msg.relation_id))
    buf.changes.append(change)
    return i + 1, row_size(change, len(payload)), 1
