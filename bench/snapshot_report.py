"""``bench/snapshot.py``'s summary of its default run: the medians of its rounds."""

from __future__ import annotations

import statistics

import machine  # bench/machine.py


def print_all_tables(args, runs: dict, ceilings: dict, idle: "machine.Usage",
                     rss_mb: float, rows_many: int) -> None:
    """The medians of the rounds (``runs``: figure -> one value per round): the big table
    against COPY and the producer's ceilings, the rest of the machine, the small tables."""
    def med(name: str) -> float:
        return statistics.median(runs[name])

    rows, k = args.rows, args.sessions
    print(f"one table, {rows} rows ({args.client}), medians of {args.repeat} round(s):")
    print(f"  COPY to /dev/null        {med('copy'):8.2f} s  {rows / med('copy'):12,.0f} rows/s")
    print(f"  producer ceiling         {med('ceiling'):8.2f} s  {rows / med('ceiling'):12,.0f}"
          f" records/s  cpu {med('ceiling cpu'):6.2f} s (bench/sink.py, same records)")
    if "packed" in ceilings:
        print(f"  producer ceiling, packed {med('packed'):8.2f} s  "
              f"{rows / med('packed'):12,.0f} records/s  cpu {med('packed cpu'):6.2f} s "
              "(the same, as the snapshot's C path hands them over)")
    for s in sorted({1, k}):
        vs_packed = (f", {med(f'snap{s}/packed'):.2f}x the packed ceiling's"
                     if "packed" in ceilings else "")
        print(f"  snapshot, {s} session(s)   {med(f'snap{s}'):8.2f} s  "
              f"{rows / med(f'snap{s}'):12,.0f} rows/s  cpu {med(f'snap{s} cpu'):6.2f} s"
              f"  ({med(f'snap{s}/ceiling'):.2f}x the ceiling's time{vs_packed})")
    print("  the rest of the machine (medians) over the ceilings' clocks and the router's "
          "whole runs (its start and the slot's creation included); with nothing to do, "
          f"per second: {idle.text(per=3.0)}")
    for name in [*ceilings, *(f"snap{s}" for s in sorted({1, k}))]:
        print(f"    {name:8} {machine.Usage.median(runs[f'{name} machine']).text()}")
    print(f"  {k} sessions / 1 session  {med('speedup'):8.2f}x rows/s")
    print(f"  COPY of its ranges, {k} sessions at once {med('copy ranges'):6.2f} s "
          f"({med('copy') / med('copy ranges'):.2f}x one COPY's rows/s)")
    print(f"  snapshot / COPY          {med('snap1') / med('copy'):8.2f}")
    print(f"  router max RSS           {rss_mb:8.0f} MB")
    print(f"{args.tables} tables, {rows_many} rows:")
    print(f"  sequential COPYs       {med('copy many'):8.2f} s  "
          f"{rows_many / med('copy many'):12,.0f} rows/s")
    print(f"  parallel snapshot      {med('snap many'):8.2f} s  "
          f"{rows_many / med('snap many'):12,.0f} rows/s  cpu {med('snap many cpu'):6.2f} s")
    print(f"  ratio snapshot/COPYs   {med('snap many') / med('copy many'):8.2f}")
