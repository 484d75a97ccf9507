"""Snapshot progress lines: rows done against the estimate, rate and ETA per table, a line
per finished table and a summary (autojump clock: no real waiting)."""

from __future__ import annotations

import logging

import trio

from actors.snapshot.report import Reporter


async def test_progress_lines_rate_eta_and_summary(caplog, autojump_clock):
    caplog.set_level(logging.INFO, logger="pgrouter.snapshot")
    report = Reporter("backfill", interval=10)
    report.start("public.t", 1000)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(report.run)
        for _ in range(3):
            report.add("public.t", 100)
            await trio.sleep(4)
        nursery.cancel_scope.cancel()
    report.add("public.t", 700)
    report.finish("public.t")
    report.summary()
    fields = [(r.getMessage(), r.fields) for r in caplog.records]
    progress = [f for m, f in fields if m == "backfill: progress"]
    assert progress and progress[0]["table"] == "public.t"
    assert progress[0]["estimated_rows"] == 1000 and progress[0]["rows"] == 300
    assert progress[0]["percent"] == 30.0
    assert progress[0]["rows_per_s"] > 0 and progress[0]["eta_s"] is not None
    done = [f for m, f in fields if m == "backfill: table done"]
    assert done and done[0]["rows"] == 1000
    summary = [f for m, f in fields if m == "backfill: done"]
    assert summary and summary[0]["rows"] == 1000 and summary[0]["tables"] == 1
