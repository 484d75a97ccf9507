"""Signals (``router.snapshot.signals``) acted upon: a row of ``pgrouter.signals`` is a backfill
request of the ``BackfillActor``, recorded in the state topic before its transaction is
confirmed, so it is acted upon exactly once across restarts.

Rules:

* The router actor hands over the signals of a transaction (``ChangeRouter.take_signals``)
  before that transaction's last chunk goes to the sink: the slot never confirms a signal
  whose request is not recorded.
* Accepted: the jobs (``BackfillActor._plan``, request id ``router.snapshot.signals.request_id``)
  then a ``signal`` record, state ``accepted``. The signals of one transaction are planned
  from one read of the catalog and their records written in one batch (1,000 signals in
  one transaction were 1,000 catalog reads and 2,000 acknowledged writes one after
  another). Refused (unreadable, unknown route or table, a table without a key, a bad
  ``where``): one warning line and a ``signal`` record, state ``refused`` with the problem;
  the router goes on.
* A signal asking for a (route, table) whose backfill runs (or is planned, or waits) is
  not dropped: a job of the same rows (same ``where``) planned and not started yet — of
  this transaction's signals, waiting, or an earlier signal's queued and not yet taken by a
  driver (``BackfillActor.unstarted``: it reads every row after this signal's commit) —
  takes it too (merged: ``accepted``); otherwise its job waits for that backfill to end and runs
  after it (``queued``, then ``accepted`` when it starts, its job's state record written
  then). A ``queued`` record is planned again at the next start, so a queued signal
  outlives a restart.
* A signal whose record exists already (read again after a restart) is skipped.
* ``recent``: the last signals of this process, for ``/api/status``; ``recorded``: the
  last ones the state topic holds for the slot, for ``pgrouter status`` (another process).
"""

from __future__ import annotations

import collections
import time
from logging import WARNING

import msgspec

from router.snapshot.core import SnapshotState, decode_state
from router.snapshot.signals import PREFIX as SIGNAL_PREFIX, decode_signal, problem, request_id
from router.errors import SourceError
from router.routing.topics import TopicSpec

from ..kafka.compacted import read_topic
from ..services import log

_log = log.get("snapshot")
#: the last signals seen (the console's ``signals``)
recent: collections.deque = collections.deque(maxlen=50)
#: the signals ``pgrouter status`` lists
RECORDED = 10


def status() -> list[dict]:
    return list(recent)


async def on_signals(actor, signals: list[tuple[int, int, bytes]]) -> None:
    """The signal messages of one transaction, ``(commit_lsn, seq, content)`` (``actor``: the
    ``BackfillActor``): planned from one read of the catalog, their jobs' and their own
    state records written in one batch, then the jobs queued."""
    mine = []
    for commit_lsn, seq, content in signals:
        signal, unreadable = decode_signal(content)
        if signal is not None and signal.slot and signal.slot != actor.slot:
            continue  # another router's
        rid = request_id(signal, commit_lsn, seq)
        if actor.store.get(SnapshotState("signal", actor.slot, "", request=rid)) is None:
            mine.append((rid, signal, unreadable))  # (else acted upon before this restart)
    if not mine:
        return
    routes = {r.name for r in actor.cfg.routes}
    states: list = []
    queued: list = []
    seen: list = []
    planned: set = set()
    fresh_where: set = set()  # (route, table, where) of this batch's jobs, not started
    async with actor.planner.lock:
        reloaded = False
        for rid, signal, unreadable in mine:
            why, waits = unreadable or problem(signal, routes), []
            if not why:
                if not reloaded:
                    await actor.planner.reload()
                    reloaded = True
                where = signal.where if signal.where is not None else ""
                busy: list = []
                fresh, problems, jobs_states = await actor._plan(
                    rid, [signal.route], [signal.table] if signal.table else [], (), True,
                    where, planned, busy)
                states += jobs_states
                fresh_where.update((j.route, j.name, j.where) for j in fresh)
                waits = [j for j in busy if not _merged(actor, j, fresh_where)]
                fresh_where.update((j.route, j.name, j.where) for j in waits)
                queued.append((rid, fresh, waits))
                why = "; ".join(problems)
            seen.append((rid, signal, why, "refused" if why else
                         "queued" if waits else "accepted"))
    for rid, signal, why, state in seen:
        states.append(SnapshotState(
            "signal", actor.slot, state, request=rid,
            route=(signal and signal.route) or "", table=(signal and signal.table) or "",
            problem=why, where=(signal and signal.where) or ""))
    await actor.store.aput_many(states)  # before the transaction can be confirmed
    for rid, fresh, _ in queued:
        _enqueue(actor, rid, fresh)
    for rid, signal, why, state in seen:
        _said(rid, signal, why, state)
    for rid, _, waits in queued:
        await _wait(actor, rid, waits)


def _enqueue(actor, rid: str, jobs: list) -> None:
    """``jobs`` queued for the drivers; those queued (not refused) are ``unstarted`` until a
    driver takes them."""
    actor._enqueue(rid, jobs)
    for job in jobs:
        if (job.route, job.name) in actor._running:
            actor.unstarted[(job.route, job.name)] = job


def _merged(actor, job, fresh_where: set) -> bool:
    """A job of the same rows planned and not started yet (in this batch, waiting, or an
    earlier signal's not yet taken by a driver) copies what ``job`` would: ``job`` is not
    needed."""
    if job.keys:
        return False
    waiting = actor.waiting.get((job.route, job.name), ())
    queued = actor.unstarted.get((job.route, job.name))
    return ((job.route, job.name, job.where) in fresh_where
            or any(j.where == job.where and not j.keys for _, j in waiting)
            or (queued is not None and queued.where == job.where and not queued.keys
                and not queued.skip and queued.last_key is None))


async def _wait(actor, rid: str, jobs: list) -> None:
    """``jobs`` (of request ``rid``, whose ``queued`` record is written) wait for the running
    backfill of their (route, table): each counts as active meanwhile (``--until-caught-up``
    waits for it); one whose backfill ended meanwhile starts now."""
    for job in jobs:
        actor._active += 1
        key = (job.route, job.name)
        if key in actor._running or key in actor.waiting:
            actor.waiting.setdefault(key, []).append((rid, job))
            log.event(_log, "backfill waits for the one running for its table",
                      request=rid, route=job.route, table=job.name)
        else:
            await _start(actor, rid, job)


async def next_waiting(actor, job) -> None:
    """``job`` ended: the first job waiting for its (route, table) starts."""
    key = (job.route, job.name)
    waiting = actor.waiting.get(key)
    if waiting:
        rid, nxt = waiting.pop(0)
        if not waiting:
            del actor.waiting[key]
        await _start(actor, rid, nxt)


async def _start(actor, rid: str, job) -> None:
    """A waiting job starts: its ``running`` record, and its signal ``accepted`` when no
    other job of it waits, written before it is queued."""
    actor._running.add((job.route, job.name))  # no other job of it starts meanwhile
    states = [actor._progress(job, "running")]
    left = any(r == rid for jobs in actor.waiting.values() for r, _ in jobs)
    record = actor.store.get(SnapshotState("signal", actor.slot, "", request=rid))
    if not left and record is not None:
        states.append(msgspec.structs.replace(record, state="accepted"))
    await actor.store.aput_many(states)
    actor._active -= 1  # (counted while it waited; ``_queue`` counts it again)
    _enqueue(actor, rid, [job])
    if not left:
        for entry in recent:
            if entry["request"] == rid:
                entry["state"] = "accepted"


async def copy_where(job, reader, select: str, keep, params: tuple) -> str:
    """A chunk of ``job`` read into ``keep``; "" when read, else (the job has a ``where``
    that PostgreSQL cannot evaluate on a row: ``id / 0 > 1``, ``id * 2147483647 > 0``, a
    data exception or an operator the columns' types lack) why: such a chunk
    fails at every try, a restart of the pipeline would not help. No row of it is kept."""
    got: list = []

    async def mine(batch: list) -> None:
        got.extend(batch)
    try:
        await reader.copy(select, mine, f"reading a chunk of {job.name}", params)
    except SourceError as exc:
        state = getattr(exc.__cause__, "sqlstate", None) or ""
        if not job.where or state[:2] not in ("22", "42") or state == "42501":
            raise  # not the where's: transient, or the router's
        return str(exc)
    await keep(got)
    return ""


async def where_failed(actor, job, why: str) -> None:
    """``job``'s ``where`` cannot be read (``copy_where``): one warning line, the job
    recorded ``failed`` (not resumed) with the problem, its signal's record too; the stream
    goes on."""
    log.event(_log, "backfill failed: its where cannot be evaluated", level=WARNING,
              request=job.request, route=job.route, table=job.name, where=job.where,
              problem=why)
    states = [msgspec.structs.replace(actor._progress(job, "failed"), problem=why)]
    record = actor.store.get(SnapshotState("signal", actor.slot, "", request=job.request))
    if record is not None:
        states.append(msgspec.structs.replace(record, state="failed", problem=why))
    await actor.store.aput_many(states)
    actor.report.finish(job.name)
    for entry in recent:
        if entry["request"] == job.request:
            entry["state"], entry["problem"] = "failed", why


async def resume_queued(actor) -> None:
    """The ``queued`` signals the state topic holds for the slot (the router stopped while
    their jobs waited): planned again (``refused`` when a table is gone meanwhile); a job
    started before the stop is left out (``_plan``: its request's state record exists)."""
    records = [p for p in actor.store.records.values()
               if p.kind == "signal" and p.slot == actor.slot and p.state == "queued"]
    if not records:
        return
    planned: set = set()
    for p in records:
        busy: list = []
        async with actor.planner.lock:
            await actor.planner.reload()
            fresh, problems, states = await actor._plan(p.request, [p.route],
                                                        [p.table] if p.table else [], (), True,
                                                        p.where, planned, busy)
        why = "; ".join(problems)  # (its table dropped while the router was down...)
        if why:
            log.event(_log, "signal refused", level=WARNING, request=p.request, route=p.route,
                      table=p.table, problem=why)
        if not busy:
            states.append(msgspec.structs.replace(p, state="refused" if why else "accepted",
                                                  problem=why))
        await actor.store.aput_many(states)
        actor._enqueue(p.request, fresh)
        await _wait(actor, p.request, busy)


def _said(rid: str, signal, why: str, state: str) -> None:
    route = signal.route if signal is not None else None
    table = signal.table if signal is not None else None
    where = signal.where if signal is not None else None
    recent.append({"request": rid, "route": route or "", "table": table or "",
                   "state": state, "problem": why or None, "ts": time.time()})
    extra = {"where": where} if where is not None else {}
    if why:
        log.event(_log, "signal refused", level=WARNING, request=rid, route=route,
                  table=table, problem=why, **extra)
    else:
        log.event(_log, f"signal {state}", request=rid, route=route, table=table, **extra)


def recorded(cfg, slot: str, last: int = RECORDED) -> tuple[int, dict[str, int], list[dict]]:
    """The ``signal`` records of the state topic for ``slot`` (blocking: a worker
    thread's): how many, how many per state, and the ``last`` ones in the order they were
    first recorded (the topic has one partition; compaction keeps offset order), each in its
    last state."""
    k = cfg.kafka
    latest: dict = {}  # request -> its last record (a queued signal is recorded again)
    for _, value in read_topic(k.bootstrap_servers, dict(k.settings), cfg.snapshot.state_topic,
                               library=k.client):
        p = decode_state(value)
        if p is not None and p.kind == "signal" and p.slot == slot:
            latest[p.request] = p
    found = list(latest.values())
    states = collections.Counter(p.state for p in found)
    return len(found), dict(sorted(states.items())), [
        {"request": p.request, "route": p.route, "table": p.table or None,
         "where": p.where or None, "state": p.state, "problem": p.problem or None}
        for p in found[-last:]]


def signal_handler(backfill):
    """``on_signals`` bound to ``backfill`` (None without a backfill actor)."""
    if backfill is None:
        return None

    async def handle(signals: list) -> None:
        await on_signals(backfill, signals)
    return handle


def router_extras(cfg, backfill) -> dict:
    """``ChangeRouter`` arguments: the message routes, and the signal prefix when a backfill
    actor acts upon signals."""
    return {"message_routes": cfg.message_routes,
            "signal_prefix": SIGNAL_PREFIX if backfill is not None else ""}


def message_topic_specs(cfg) -> dict:
    """The topic settings of ``[[message_routes]]`` by route name (the sink creates their
    topics as messages make them)."""
    return {m.name: TopicSpec(m.name, m.topic_settings.partitions,
                              m.topic_settings.replication_factor, m.topic_settings.configs)
            for m in cfg.message_routes}
