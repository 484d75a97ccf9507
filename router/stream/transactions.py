"""Transaction assembly: decoded pgoutput messages in, whole committed transactions out.

``TransactionAssembler.feed(lsn, msg)`` returns the events the message completes:
``Transaction`` (with its ``Change``s), ``NonTransactionalMessage``, and — only with
``emit_prepared_at="prepare"`` — ``PreparedOutcome`` for Commit/Rollback Prepared.

Rules:

* Begin … Commit is a normal transaction; its changes are released at Commit. A large one
  (``part_changes`` changes buffered, or some spilled) is released in parts by ``feed_batch``
  while it arrives, at the end of each batch: ``Transaction``s with ``partial=True``,
  ``end_lsn`` 0 and ``first_seq`` the count of its changes released before, then the rest at
  Commit (``partial=False``, ``first_seq`` likewise). Sent at its commit (Begin carries the
  commit LSN and time), such a transaction can no longer abort, so its parts are final.
  Only row changes go in parts: from its first Truncate or logical message on (a TRUNCATE
  marker, a definitions message, a signal: things that belong with the commit's end LSN or
  with each other) the rest is held until Commit. Begin Prepare (two-phase) and streamed
  transactions are never released in parts: they can still be rolled back.
* Relation and Type messages update the ``RelationCache`` wherever they appear. Each
  ``Change`` keeps the ``Relation`` in effect when it was decoded, so a relation altered in
  the middle of a transaction is described correctly on both sides of the change.
* Transactional logical messages belong to their transaction; non-transactional ones are
  released at once.
* Streamed transactions (v2): Stream Start … Stop blocks of several xids may interleave; each
  xid is buffered until Stream Commit. The xid of a streamed data message is the
  *subtransaction's*, so every buffered change remembers it: Stream Abort with
  ``subxid != xid`` drops that subtransaction's changes, with ``subxid == xid`` the whole
  transaction. (A transactional logical message is sent with the top-level xid by pgoutput,
  so it survives the abort of the subtransaction that emitted it.)
* Two-phase (v3): Begin Prepare … Prepare and Stream Prepare are held by gid until Commit
  Prepared (released as a ``Transaction`` with ``gid`` set) or Rollback Prepared (dropped).
  With ``emit_prepared_at="prepare"`` the transaction is released at Prepare instead and the
  outcome follows as a ``PreparedOutcome``. In commit mode a consumer must not confirm an LSN
  past a held prepare (``pending_prepared``): the server would not send its changes again.
* Memory: buffered changes (a streamed transaction's rows as they came: ``router.stream.changes``)
  are estimated in bytes; beyond ``memory_limit`` the largest buffers go to a temporary file
  (in ``spill_dir``), read back when the transaction's ``changes`` are iterated.
* Anything out of order (a change outside a transaction, Commit without Begin, nested Begin,
  a Stream Commit for an unknown xid, …) raises ``ProtocolViolation``.
"""

from __future__ import annotations

from typing import Literal

from ..errors import ProtocolViolation
from ..native import NATIVE
from ..pgoutput import messages as m
from .changes import CHANGE_OVERHEAD, VALUE_OVERHEAD, Change, ChangeBuffer
from .events import NonTransactionalMessage, PreparedOutcome, Transaction  # noqa: F401  (re-exported)
from .changes import change_size, row_change, take_raw
from .relations import RelationCache
from .short_transactions import bind_short, feed_row

DEFAULT_MEMORY_LIMIT = 64 * 1024 * 1024
#: changes buffered after which a non-streamed transaction is released in parts
PART_CHANGES = 8192
_ROWS = frozenset(("insert", "update", "delete"))


class TransactionAssembler:
    def __init__(self, relations: RelationCache, *, memory_limit: int = DEFAULT_MEMORY_LIMIT,
                 spill_dir: str | None = None,
                 emit_prepared_at: Literal["commit", "prepare"] = "commit",
                 part_changes: int | None = PART_CHANGES):
        if emit_prepared_at not in ("commit", "prepare"):
            raise ValueError(f"emit_prepared_at must be 'commit' or 'prepare', "
                             f"not {emit_prepared_at!r}")
        self.relations = relations
        self.memory_limit = memory_limit
        self.spill_dir = spill_dir
        self.emit_prepared_at = emit_prepared_at
        self.part_changes = part_changes  # None: every transaction released whole
        self._current: ChangeBuffer | None = None  # Begin or Begin Prepare … not yet finished
        self._streams: dict[int, ChangeBuffer] = {}
        self._stream_xid: int | None = None  # inside Stream Start … Stop of this xid
        self._prepared: dict[str, ChangeBuffer] = {}
        self._memory = 0
        self.spill_count = 0

    # -- introspection --------------------------------------------------------------------

    @property
    def memory(self) -> int:
        """Estimated bytes of changes currently buffered in memory."""
        return self._memory

    @property
    def pending_prepared(self) -> dict[str, int]:
        """gid -> xid of prepared transactions held until Commit/Rollback Prepared."""
        return {gid: buf.xid for gid, buf in self._prepared.items()}

    @property
    def open_streams(self) -> tuple[int, ...]:
        return tuple(self._streams)

    @property
    def buffering(self) -> bool:
        """A transaction or stream is open (prepared transactions held until COMMIT
        PREPARED do not count: they cap confirmation with ``hold_lsn`` instead)."""
        return self._current is not None or self._stream_xid is not None or bool(self._streams)

    @property
    def held(self) -> tuple[int, str] | None:
        """(prepare LSN, gid) of the earliest prepared transaction held, if any."""
        if not self._prepared:
            return None
        return min((buf.final_lsn, gid) for gid, buf in self._prepared.items())

    @property
    def hold_lsn(self) -> int | None:
        """The earliest prepare LSN of prepared transactions held until COMMIT PREPARED.
        Confirming a flush position at or past it would make PostgreSQL skip the prepared
        changes after a restart (it would send only the COMMIT PREPARED)."""
        held = self.held
        return None if held is None else held[0]

    # -- feeding --------------------------------------------------------------------------

    def feed(self, lsn: int, msg) -> list:
        handler = self._HANDLERS.get(type(msg))
        if handler is None:
            raise TypeError(f"not a pgoutput message: {type(msg).__name__}")
        return handler(self, lsn, msg)

    def feed_batch(self, messages, decode) -> list:
        """``feed`` for a list of ``(lsn, payload)``: every payload decoded with ``decode``
        (``Decoder.decode``), the released events of the whole batch in order.

        Row changes inside Begin … Commit take a short path with the same outcome as
        ``feed``: the Change goes straight into the open buffer, estimated from the message
        size, the limit checked per change; runs of them through ``router._native.feed_rows``
        when the decoder allows it (``Decoder.row_decoder``, asked again after every other
        message). Between transactions short ones are taken whole
        (``router.stream.short_transactions``); in a stream block rows are kept undecoded
        (``router.stream.changes.take_raw``)."""
        events: list = []
        limit = self.memory_limit
        row_decoder = getattr(getattr(decode, "__self__", None), "row_decoder", None)
        feed_rows = NATIVE.feed_rows if row_decoder is not None and row_decoder() else None
        short = bind_short(Transaction, decode, feed_rows is not None)
        by_id = self.relations.by_id
        i, n = 0, len(messages)
        while i < n:
            buf = self._current
            if buf is None and self._stream_xid is None:
                j = short(messages, i, by_id, limit - self._memory, events)
                if j > i:
                    i = j
                    continue
            j = i
            if buf is not None:
                if feed_rows is not None:
                    j, size, count = feed_rows(messages, i, buf.changes, by_id,
                                               Change, CHANGE_OVERHEAD, VALUE_OVERHEAD,
                                               limit - self._memory)
                else:
                    j, size, count = feed_row(buf, messages, i, decode, self)
            elif self._stream_xid is not None:  # streamed rows kept as they came
                buf = self._streams[self._stream_xid]
                j, size = take_raw(messages, i, buf.raw, limit - self._memory)
                count = j - i
            if j > i:
                buf.memory += size
                buf.count += count
                self._memory += size
                if self._memory > limit:
                    self._spill()
                i = j
                continue
            lsn, payload = messages[i]
            i += 1
            released = self.feed(lsn, decode(payload))
            if row_decoder is not None:
                feed_rows = NATIVE.feed_rows if row_decoder() else None
            if released:
                events.extend(released)
        buf = self._current
        if buf is not None and buf.parts and buf.count and (
                buf.released or buf.count >= self.part_changes or buf.file is not None):
            events.append(self._part(buf))
        return events

    def _part(self, buf: ChangeBuffer) -> Transaction:
        """What ``buf`` holds, released as a part; the rest of it is buffered anew."""
        changes = buf.release(self.relations.by_id)
        self._forget(buf)
        rest = self._current = ChangeBuffer(buf.xid, buf.final_lsn)
        rest.origin_name, rest.origin_lsn = buf.origin_name, buf.origin_lsn
        rest.commit_time, rest.released, rest.parts = (
            buf.commit_time, buf.released + buf.count, True)
        return Transaction(buf.xid, buf.final_lsn, buf.final_lsn, 0, buf.commit_time,
                           buf.origin_name, buf.origin_lsn, None, changes, buf.count,
                           first_seq=buf.released, partial=True)

    def _violation(self, text: str) -> ProtocolViolation:
        return ProtocolViolation(text)

    def _target(self, what: str) -> tuple[ChangeBuffer, int]:
        if self._current is not None:
            return self._current, self._current.xid
        if self._stream_xid is not None:
            return self._streams[self._stream_xid], self._stream_xid
        raise self._violation(f"{what} outside a transaction")

    def _add(self, what: str, change: Change, subxid: int | None) -> list:
        buf, default_subxid = self._target(what)
        if buf.raw:  # the raw rows before it decoded first: the order
            self._memory += buf.materialize(self.relations.by_id)
        if change.op not in _ROWS:  # the rest of it is released at Commit
            buf.parts = False
        size = change_size(change)
        buf.add(change, default_subxid if subxid is None else subxid, size)
        self._memory += size
        if self._memory > self.memory_limit:
            self._spill()
        return []

    def _spill(self) -> None:
        buffers = [b for b in (self._current, *self._streams.values(),
                               *self._prepared.values()) if b is not None]
        for buf in sorted(buffers, key=lambda b: b.memory, reverse=True):
            if self._memory <= self.memory_limit // 2:
                break
            if buf.memory:
                self._memory -= buf.spill(self.spill_dir, self.relations.by_id)
                self.spill_count += 1

    def _forget(self, buf: ChangeBuffer) -> None:
        self._memory -= buf.memory
        buf.memory = 0

    def _on_catalog(self, lsn: int, msg) -> list:
        for buf in (*self._streams.values(), *self._prepared.values()):  # raw rows decoded
            self._memory += buf.materialize(self.relations.by_id)  # with the relations sent
        self.relations.apply(msg)
        return []

    def _on_row(self, lsn: int, msg: m.Insert | m.Update | m.Delete) -> list:
        change = row_change(lsn, msg, self.relations.get(msg.relation_id))
        return self._add(type(msg).__name__, change, msg.xid)

    def _on_truncate(self, lsn: int, msg: m.Truncate) -> list:
        rels = tuple(self.relations.get(r) for r in msg.relation_ids)
        change = Change("truncate", lsn, relations=rels, options=msg.options)
        return self._add("Truncate", change, msg.xid)

    def _on_message(self, lsn: int, msg: m.Message) -> list:
        if not msg.transactional:
            return [NonTransactionalMessage(lsn, msg)]
        return self._add("transactional Message", Change("message", lsn, message=msg), msg.xid)

    def _on_origin(self, lsn: int, msg: m.Origin) -> list:
        buf, _ = self._target("Origin")
        buf.origin_name, buf.origin_lsn = msg.name, msg.commit_lsn
        return []

    def _check_idle(self, what: str) -> None:
        if self._current is not None:
            raise self._violation(f"{what} inside transaction {self._current.xid}")
        if self._stream_xid is not None:
            raise self._violation(f"{what} inside the stream block of {self._stream_xid}")

    def _on_begin(self, lsn: int, msg: m.Begin) -> list:
        self._check_idle("Begin")
        buf = self._current = ChangeBuffer(msg.xid, msg.final_lsn)
        buf.commit_time, buf.parts = msg.commit_time, self.part_changes is not None
        return []

    def _on_commit(self, lsn: int, msg: m.Commit) -> list:
        buf = self._current
        if buf is None or buf.gid is not None:
            raise self._violation("Commit without Begin")
        if msg.commit_lsn != buf.final_lsn:
            raise self._violation(f"Commit LSN {msg.commit_lsn:X} differs from Begin's final "
                                  f"LSN {buf.final_lsn:X}")
        self._current = None
        self._forget(buf)
        return [self._transaction(buf, msg.commit_lsn, msg.end_lsn, msg.commit_time)]

    def _transaction(self, buf: ChangeBuffer, commit_lsn: int, end_lsn: int, time: int,
                     prepared: bool = False) -> Transaction:
        changes = buf.release(self.relations.by_id)
        return Transaction(buf.xid, buf.final_lsn or commit_lsn, commit_lsn, end_lsn, time,
                           buf.origin_name, buf.origin_lsn, buf.gid, changes, len(changes),
                           buf.streamed, prepared, buf.released)

    # streaming (v2)
    def _on_stream_start(self, lsn: int, msg: m.StreamStart) -> list:
        self._check_idle("Stream Start")
        known = msg.xid in self._streams
        if msg.first_segment and known:
            raise self._violation(f"first stream segment of {msg.xid} seen twice")
        if not msg.first_segment and not known:
            raise self._violation(f"stream segment of unknown transaction {msg.xid}")
        if not known:
            self._streams[msg.xid] = ChangeBuffer(msg.xid, streamed=True)
        self._stream_xid = msg.xid
        return []

    def _on_stream_stop(self, lsn: int, msg: m.StreamStop) -> list:
        if self._stream_xid is None:
            raise self._violation("Stream Stop outside a stream block")
        self._stream_xid = None
        return []

    def _stream(self, what: str, xid: int) -> ChangeBuffer:
        self._check_idle(what)
        try:
            return self._streams.pop(xid)
        except KeyError:
            raise self._violation(f"{what} for unknown streamed transaction {xid}") from None

    def _on_stream_commit(self, lsn: int, msg: m.StreamCommit) -> list:
        buf = self._stream("Stream Commit", msg.xid)
        self._forget(buf)
        return [self._transaction(buf, msg.commit_lsn, msg.end_lsn, msg.commit_time)]

    def _on_stream_abort(self, lsn: int, msg: m.StreamAbort) -> list:
        self._check_idle("Stream Abort")
        buf = self._streams.get(msg.xid)
        if buf is None:
            raise self._violation(f"Stream Abort for unknown streamed transaction {msg.xid}")
        if msg.subxid == msg.xid:
            del self._streams[msg.xid]
            self._forget(buf)
            if buf.file is not None:
                buf.file.close()
        else:
            self._memory -= buf.abort_subxact(msg.subxid)
        return []

    # two-phase (v3)
    def _on_begin_prepare(self, lsn: int, msg: m.BeginPrepare) -> list:
        self._check_idle("Begin Prepare")
        self._current = ChangeBuffer(msg.xid, msg.prepare_lsn, gid=msg.gid)
        return []

    def _prepared_event(self, buf: ChangeBuffer, msg) -> list:
        if buf.gid in self._prepared:
            raise self._violation(f"transaction {buf.gid!r} prepared twice")
        buf.final_lsn = msg.prepare_lsn
        if self.emit_prepared_at == "prepare":
            self._forget(buf)
            return [self._transaction(buf, msg.prepare_lsn, msg.end_lsn, msg.prepare_time,
                                      prepared=True)]
        self._prepared[buf.gid] = buf
        return []

    def _on_prepare(self, lsn: int, msg: m.Prepare) -> list:
        buf = self._current
        if buf is None or buf.gid is None:
            raise self._violation("Prepare without Begin Prepare")
        if buf.gid != msg.gid or buf.xid != msg.xid:
            raise self._violation(f"Prepare of {msg.gid!r} inside Begin Prepare of {buf.gid!r}")
        self._current = None
        return self._prepared_event(buf, msg)

    def _on_stream_prepare(self, lsn: int, msg: m.StreamPrepare) -> list:
        buf = self._stream("Stream Prepare", msg.xid)
        buf.gid = msg.gid
        return self._prepared_event(buf, msg)

    def _on_commit_prepared(self, lsn: int, msg: m.CommitPrepared) -> list:
        self._check_idle("Commit Prepared")
        if self.emit_prepared_at == "prepare":
            return [PreparedOutcome(msg.xid, msg.gid, True, msg.commit_lsn, msg.end_lsn,
                                    msg.commit_time)]
        buf = self._prepared.pop(msg.gid, None)
        if buf is None:
            raise self._violation(f"Commit Prepared of unknown transaction {msg.gid!r}")
        self._forget(buf)
        return [self._transaction(buf, msg.commit_lsn, msg.end_lsn, msg.commit_time)]

    def _on_rollback_prepared(self, lsn: int, msg: m.RollbackPrepared) -> list:
        self._check_idle("Rollback Prepared")
        if self.emit_prepared_at == "prepare":
            return [PreparedOutcome(msg.xid, msg.gid, False, msg.rollback_end_lsn,
                                    msg.rollback_end_lsn, msg.rollback_time)]
        # An unknown gid is legal: a transaction prepared before two-phase decoding was
        # enabled is rolled back without its Prepare ever having been sent.
        buf = self._prepared.pop(msg.gid, None)
        if buf is not None:
            self._forget(buf)
            if buf.file is not None:
                buf.file.close()
        return []

    _HANDLERS = {
        m.Relation: _on_catalog, m.Type: _on_catalog, m.Insert: _on_row,
        m.Update: _on_row, m.Delete: _on_row, m.Truncate: _on_truncate,
        m.Message: _on_message, m.Origin: _on_origin, m.Begin: _on_begin,
        m.Commit: _on_commit, m.StreamStart: _on_stream_start,
        m.StreamStop: _on_stream_stop, m.StreamCommit: _on_stream_commit,
        m.StreamAbort: _on_stream_abort, m.BeginPrepare: _on_begin_prepare,
        m.Prepare: _on_prepare, m.StreamPrepare: _on_stream_prepare,
        m.CommitPrepared: _on_commit_prepared, m.RollbackPrepared: _on_rollback_prepared,
    }
