"""Block ranges of the initial snapshot: one table read by several sessions at once.

Rules:

* A big table is read in ``ctid`` ranges of blocks ``[first, end)`` (TID range scans,
  PostgreSQL 14+), every session on the slot's exported snapshot, so together the ranges
  hold exactly the table at the consistent point. The first range starts at block 0, the
  last one is open (rows in blocks added since the size was read are still read).
* Positions: the row ordinal of a split table's record counts within its range, above it
  the range's ordinal (``router.snapshot.core.initial_position``): unique per snapshot.
* A range whose records are all in Kafka is recorded done (a ``range`` state); a kill
  loses at most the ranges in flight: finishing the snapshot by backfill leaves out the
  rows in the ranges recorded done (``done_blocks``), unless the table was rewritten since
  (its ``filenode`` changed: rows moved to other blocks).
"""

from __future__ import annotations

from .core import RANGE_SHIFT, TABLE_SHIFT

#: block ranges of one table at most (the bits between RANGE_SHIFT and TABLE_SHIFT)
MAX_RANGES = 1 << (TABLE_SHIFT - RANGE_SHIFT)
#: a table is split only into ranges of at least this many blocks (8 MiB of 8 kB pages)
MIN_RANGE_BLOCKS = 1024
#: ranges per session: a range that reads slowly (denser or bloated blocks) leaves the
#: others something to take
RANGES_PER_SESSION = 4


def done_blocks(states, slot: str, snapshot: str, table: str, filenode: int
                ) -> list[tuple[int, int | None]]:
    """The block ranges of ``table`` the interrupted initial snapshot ``snapshot`` (its
    ``initial`` record's ``request``) of ``slot`` recorded done (``range`` states), merged
    where they touch; none when the table was rewritten since (another ``filenode``: its
    rows moved to other blocks) or the snapshot has no name (recorded by an older
    version)."""
    if not snapshot:
        return []
    spans = sorted(p.blocks for p in states
                   if p.kind == "range" and p.slot == slot and p.request == snapshot
                   and p.table == table and p.state == "done" and p.filenode == filenode
                   and len(p.blocks) == 2)
    out: list[list] = []
    for first, end in spans:
        if out and out[-1][1] == first:
            out[-1][1] = end
        elif out and out[-1][1] < 0:
            break  # (ranges of one split never overlap)
        else:
            out.append([first, end])
    return [(a, None if b < 0 else b) for a, b in out]


def block_ranges(blocks: int, sessions: int, rows: int = 0) -> list[tuple[int, int | None]]:
    """A table of ``blocks`` blocks (about ``rows`` rows) as ``[first, end)`` block ranges
    for ``sessions`` sessions reading it at once (``ctid`` ranges: TID range scans): none
    smaller than ``MIN_RANGE_BLOCKS``, at most ``RANGES_PER_SESSION`` per session — or more,
    so that a range holds well under ``2^RANGE_SHIFT`` rows (its positions). The first
    starts at block 0, the last is open (``end`` None: blocks added since the size was
    read), so the ranges cover the table whatever its size now. One range ``(0, None)``:
    not split."""
    per_session = sessions * RANGES_PER_SESSION
    enough = -(-4 * rows // (1 << RANGE_SHIFT))  # a quarter of a range's positions each
    n = max(1, min(blocks // MIN_RANGE_BLOCKS, max(per_session, enough), MAX_RANGES))
    if sessions <= 1 or n == 1:
        return [(0, None)]
    bounds = [blocks * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1] if i + 1 < n else None) for i in range(n)]
