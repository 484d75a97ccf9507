"""What ``router.stream.transactions.TransactionAssembler`` releases (imported from there
too): whole transactions or parts of one, non-transactional logical messages, and the fate
of a transaction released at Prepare."""

from __future__ import annotations

import msgspec

from ..pgoutput import messages as m
from .changes import Changes


class Transaction(msgspec.Struct, frozen=True):
    """A finished transaction, or a part of one released before its Commit (``partial``;
    ``end_lsn`` 0; the next part or the rest follows). For two-phase transactions ``gid`` is
    set; released at Prepare (``prepared=True``) ``commit_lsn``/``end_lsn``/``commit_time``
    are the prepare's."""

    xid: int
    final_lsn: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    origin_name: str | None
    origin_lsn: int | None
    gid: str | None
    changes: Changes
    change_count: int
    streamed: bool = False
    prepared: bool = False
    #: seq of the first change (the changes released before in parts)
    first_seq: int = 0
    #: a part released before Commit: more of the transaction follows (end LSN 0)
    partial: bool = False


class NonTransactionalMessage(msgspec.Struct, frozen=True, gc=False):
    lsn: int
    message: m.Message


class PreparedOutcome(msgspec.Struct, frozen=True, gc=False):
    """``emit_prepared_at="prepare"`` only: the fate of a transaction released at Prepare."""

    xid: int
    gid: str
    committed: bool
    lsn: int  # commit_lsn of Commit Prepared, rollback_end_lsn of Rollback Prepared
    end_lsn: int
    time: int
