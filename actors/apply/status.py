"""``/api/status`` of ``pgrouter apply``: the applier's counters as the console shows them
(applied and skipped transactions, conflicts by kind, the last applied commit time, the
replication origin's progress), built on the HTTP thread from what the applier published."""

from __future__ import annotations

import time

from router import __version__
from router.config.console import redacted
from router.postgres.lsn import format_lsn

from ..console import board

SCHEMA = 1


def apply_status(applier) -> dict:
    a, cfg = applier, applier.cfg
    s, reader, ra = a.stats, a._reader, a._reassembler
    return {"schema": SCHEMA, "kind": "apply", "version": __version__, "name": cfg.target.origin,
            "now": time.time(),
            "state": board.state(a.health),
            "apply": {"transactions": s.transactions, "changes": s.changes,
                      "skipped": s.skipped + (ra.skipped if ra else 0),
                      "fetched": s.fetched + (reader.fetched if reader else 0),
                      "conflicts": dict(s.conflicts), "conflict_policy": cfg.target.conflict,
                      "last_commit_time": s.last_commit_time, "origin": cfg.target.origin,
                      "origin_progress_lsn": format_lsn(s.progress_lsn or 0)},
            "jobs": board.jobs.snapshot(lambda *_: None),
            "problems": board.problems.snapshot(), "config": redacted(cfg)}
