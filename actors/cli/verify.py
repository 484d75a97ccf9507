"""``pgrouter verify -c FILE [--route R …] [--table T …] [--json]``: does each route's topic
hold exactly what the route would replicate of its tables, at one position?

The source is read on a snapshot whose LSN is known; each topic is read once the router
delivered past that LSN and folded by key at it (``actors.verify``, ``router.verify.fold``). Per
route and topic: rows compared, missing in the topic, extra in the topic, different (example
keys with the differing columns), duration. Exit status 0 when every topic is equal, 1 when
one is not, 2 on an error (one line on stderr: what is wrong and where). ``--json`` prints one
JSON document, with the ``pgrouter_verify_*`` metrics in Prometheus' text format under
``metrics``.
"""

from __future__ import annotations

import argparse
import sys

import msgspec
import trio

from router.errors import ConfigError, PgRouterError

from ..runner.source import Source
from ..verify.metrics import VerifyMetrics, serve
from ..verify.run import MAX_KEYS, SPLIT_ROWS, ProgressLine, verify
from .config_file import load


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="the router's TOML config file")
    p.add_argument("--route", action="append", default=[], metavar="R",
                   help="verify this route (repeatable; default: every route)")
    p.add_argument("--table", action="append", default=[], metavar="T",
                   help="schema.table to verify (repeatable; default: every table routed)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--examples", type=int, default=5, metavar="N",
                   help="example keys shown per kind of difference (default 5)")
    p.add_argument("--wait", type=float, default=60.0, metavar="S",
                   help="seconds to wait for the router to deliver up to the verify "
                        "snapshot, and for repairs to finish (default 60)")
    p.add_argument("--max-keys", type=int, default=MAX_KEYS, metavar="N",
                   help="keys of a topic held in memory at once (about 450 bytes each); a "
                        "bigger table is verified in passes over its topic (default "
                        f"{MAX_KEYS})")
    p.add_argument("--split-rows", type=int, default=SPLIT_ROWS, metavar="N",
                   help="a differing bucket of more rows than this is split into "
                        "sub-buckets compared by digests again, rather than read whole "
                        f"(default {SPLIT_ROWS})")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", default=None,
                   help="serve the pgrouter_verify_* metrics there while verify runs "
                        "(default: [metrics] listen; \"\": none)")
    p.add_argument("--repair", action="store_true",
                   help="ask the running router to re-send what differs (a backfill of "
                        "exactly those keys; deletes for extra keys), then verify again")


def run(args: argparse.Namespace) -> int:
    progress = ProgressLine(10.0, sys.stderr)

    def warn(line: str) -> None:
        print(f"pgrouter verify: warning: {line}", file=sys.stderr)

    endpoint = None
    try:
        cfg = load(args.config, "verify")
        metrics = VerifyMetrics()
        listen = cfg.metrics.listen if args.metrics_listen is None else args.metrics_listen
        if listen:
            endpoint = serve(listen, metrics, warn, "metrics.listen" if args.metrics_listen
                             is None else "--metrics-listen")
            if endpoint is not None:
                print(f"pgrouter verify: metrics on http://{endpoint.host}:{endpoint.port}"
                      "/metrics", file=sys.stderr, flush=True)
        try:
            results = trio.run(_verify, cfg, args, progress, warn, metrics)
        except BaseExceptionGroup as group:  # trio-asyncio's loop wraps what escapes it
            from ..services.retry import primary  # its logging and console: only here

            raise primary(group) from None
    except ConfigError as exc:
        print(f"pgrouter verify: configuration error: {exc}", file=sys.stderr)
        return 2
    except PgRouterError as exc:
        print(f"pgrouter verify: {exc}", file=sys.stderr)
        return 2
    finally:
        if endpoint is not None:
            endpoint.close()
    ok = all(r.ok for r in results)
    if args.json:
        doc = {"equal": ok, "results": [dict(msgspec.structs.asdict(r), equal=r.ok)
                                        for r in results],
               "metrics": metrics_text(results)}
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
    else:
        for r in results:
            print(summary(r))
    return 0 if ok else 1


async def _verify(cfg, args, progress, warn, metrics):
    repairs: list | None = [] if args.repair else None
    slot = Source(cfg.source).slot
    results = await verify(cfg, slot, args.route, args.table, wait=args.wait,
                           examples=args.examples, progress=progress, warn=warn,
                           repairs=repairs, max_keys=args.max_keys,
                           split_rows=args.split_rows, metrics=metrics)
    if not repairs:
        return results
    from ..verify.repair import request, wait_repaired  # --repair only: its modules load then
    out = sys.stdout if not args.json else sys.stderr
    for r in results:
        if not r.ok:
            print(summary(r), file=out)
    asked = await request(cfg, slot, repairs, lambda line: print(f"pgrouter verify: {line}",
                                                            file=sys.stderr, flush=True),
                          metrics)
    if asked:
        await wait_repaired(cfg, slot, asked, args.wait)
        metrics.pending = 0
        print(f"pgrouter verify: {len(asked)} repair(s) done; verifying again",
              file=sys.stderr, flush=True)
    return await verify(cfg, slot, args.route, args.table, wait=args.wait, examples=args.examples,
                        progress=progress, warn=warn, max_keys=args.max_keys,
                        split_rows=args.split_rows, metrics=metrics)


def summary(r) -> str:
    enc = msgspec.json.encode
    head = (f"{'equal' if r.ok else 'DIFFERENT'}: route {r.route} topic {r.topic} "
            f"({', '.join(r.tables)}): {r.compared} rows compared, {r.missing} missing in the "
            f"topic, {r.extra} extra in the topic, {r.different} different"
            + (f", {r.kept} deleted rows kept (the route publishes no DELETE)" if r.kept else "")
            + (f", {r.beyond} records past the source's WAL end" if r.beyond else "")
            + f", {r.seconds:.2f} s")
    lines = [head] + [f"  note: {n}" for n in r.notes]
    if r.missing_keys:
        lines.append("  missing: " + ", ".join(enc(k).decode() for k in r.missing_keys))
    if r.extra_keys:
        lines.append("  extra: " + ", ".join(enc(k).decode() for k in r.extra_keys))
    for d in r.different_keys:
        lines.append(f"  different: {enc(d['key']).decode()} columns "
                     f"{', '.join(d['columns'])}")
    for d in r.beyond_keys:  # damage: the router never writes there
        lines.append(f"  past the WAL end: {enc(d['key']).decode()} commit_lsn "
                     f"{d['commit_lsn']}")
    return "\n".join(lines)


def metrics_text(results) -> str:
    """The ``pgrouter_verify_*`` metrics of this run in Prometheus' text format."""
    kinds = ("compared", "missing", "extra", "different", "kept")
    out = []
    for kind in kinds:
        out.append(f"# TYPE pgrouter_verify_{kind}_rows gauge")
        for r in results:
            out.append(f'pgrouter_verify_{kind}_rows{{route="{r.route}",topic="{r.topic}"}} '
                       f"{getattr(r, kind)}")
    out.append("# TYPE pgrouter_verify_equal gauge")
    out.extend(f'pgrouter_verify_equal{{route="{r.route}",topic="{r.topic}"}} {int(r.ok)}'
               for r in results)
    out.append("# TYPE pgrouter_verify_duration_seconds gauge")
    out.extend(f'pgrouter_verify_duration_seconds{{route="{r.route}",topic="{r.topic}"}} '
               f"{r.seconds}" for r in results)
    return "\n".join(out) + "\n"
