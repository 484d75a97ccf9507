"""The Python recorder: one route's records of one relation layout, for the transaction it
is bound to (``TableEncoder.recorder``).

It is the recorder itself when the C hot path is not built, and the fallback of the C
``router._native.Recorder`` for what the codec leaves to Python. Both are made once per topic
of a ``TableEncoder`` and bound to each transaction in turn (``tx``, ``lsn_header``), rather
than made for every transaction: a stream of one-row transactions would pay for that once a
record.
"""

from __future__ import annotations


class PyRecorder:
    """``record(op, lsn, seq, old, old_is_key, new) -> (topic, key, value, headers)``."""

    __slots__ = ("encode", "topic", "seq_name", "tx", "lsn_header")

    def __init__(self, encode, topic: str, seq_name: str):
        self.encode, self.topic, self.seq_name = encode, topic, seq_name
        self.tx = None  # router.formats.envelope.TxContext, set by TableEncoder.recorder
        self.lsn_header: tuple | None = None

    def __call__(self, op, lsn, seq, old, old_is_key, new):
        key, value = self.encode(op, self.tx, lsn, seq, old, old_is_key, new)
        if self.lsn_header is None:
            return (self.topic, key, value, None)
        return (self.topic, key, value, [self.lsn_header, (self.seq_name, b"%d" % seq)])
