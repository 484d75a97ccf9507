"""The writer's inbox: released source transactions waiting to be applied, taken in
batches (``actors.apply.writer``).

Rules:

* What waits in the channel joins the queue only while the queue is short of a batch
  (``BATCH_ROWS`` rows or ``BATCH_TRANSACTIONS`` transactions), so a slow target holds the
  consumer back (the channel fills) instead of this queue growing.
* A batch is one streamed transaction (``STREAM_ROWS`` rows or more, or spilled to disk),
  one snapshot batch, or consecutive small transactions up to ``BATCH_ROWS`` rows.
  Transactions a restart applied already (at or below the target's progress) are left out
  of it and counted.
"""

from __future__ import annotations

from collections import deque

import trio

from router.apply.reassembly import SourceTransaction

BATCH_ROWS = 5000  # rows of small transactions sent in one script
BATCH_TRANSACTIONS = 1000
STREAM_ROWS = 5000  # a transaction this large is streamed, this many rows an execute


class _CaughtUp:
    pass


#: sent by the consumer once everything in the transaction topic at start is released
CAUGHT_UP = _CaughtUp()


def streamed(txn) -> bool:
    return txn is not CAUGHT_UP and (txn.count >= STREAM_ROWS or txn.records.spilled)


class Inbox:
    def __init__(self, channel: trio.MemoryReceiveChannel, stats):
        self.channel = channel
        self.stats = stats
        self.queue: deque = deque()

    def top_up(self) -> None:
        queue = self.queue
        while len(queue) < BATCH_TRANSACTIONS and sum(
                t.count for t in queue if t is not CAUGHT_UP) < BATCH_ROWS:
            try:
                queue.extend(self.channel.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break

    def small_next(self) -> bool:
        """Whether the queue's head is a small transaction (one of a batch of many)."""
        queue = self.queue
        return bool(queue) and not (queue[0] is CAUGHT_UP or streamed(queue[0])
                                    or queue[0].snapshot)

    def take(self, progress_lsn: int) -> list[SourceTransaction]:
        """The next batch off the queue, whose head is a transaction."""
        queue = self.queue
        first = queue.popleft()
        batch, rows = [first], first.count
        if not streamed(first) and not first.snapshot:
            while queue and rows < BATCH_ROWS and len(batch) < BATCH_TRANSACTIONS:
                if queue[0] is CAUGHT_UP or streamed(queue[0]) or queue[0].snapshot:
                    break
                nxt = queue.popleft()
                batch.append(nxt)
                rows += nxt.count
        return [t for t in batch if not self._skip(t, progress_lsn)]

    def _skip(self, txn: SourceTransaction, progress_lsn: int) -> bool:
        # snapshot rows at the progress LSN come after the transaction committed there
        if txn.commit_lsn < progress_lsn or (txn.commit_lsn == progress_lsn
                                              and not txn.snapshot):
            self.stats.skipped += 1
            txn.records.close()
            return True
        return False
