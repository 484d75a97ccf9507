"""Backfills while streaming: chunks read between watermarks (DBLog), for some routes only.

The actor sits between the decoder and the origin filter, in the decoder's task (it sees
every committed transaction, in commit order), and runs the chunk drivers.

Rules:

* A request is a transactional ``pgrouter.snapshot`` message of kind ``request`` for this
  slot (``pgrouter snapshot`` writes it); its jobs are recorded in the state topic
  before the request's transaction moves on, so a request the slot confirmed is never lost.
  A request seen again (the stream replays what was not confirmed) is recognised by its id.
* A driver, per job: a low watermark (committed), the next ``chunk_rows`` rows by key order
  read (its own transaction, after the low watermark committed), a high watermark; the
  chunk's rows not changed between the two go out at the high watermark
  (``actors.snapshot.windows``). Changes flow as usual all along.
* The chunk's records travel through the same sink and progress tracking as changes: the
  slot's position passes the high watermark only once they are acknowledged. The driver
  waits for that, then records the chunk's last key in the state topic and goes on;
  after a ``kill -9`` a job resumes after the last key recorded (the chunk in flight is
  read again: at most one chunk per job is written twice); the initial snapshot, which runs
  before the stream, reads the sink's tickets instead (``actors.runner.coordinator`` says
  why). Watermarks of a chunk this process does not know (replayed) are ignored.
* A chunk's read locks the table before its snapshot is taken (``TableReader.begin_read``):
  a TRUNCATE or rewrite holding the table commits first, and the read sees its rows (a
  snapshot older than such a command sees the table empty). A chunk that finds the table's
  columns changed since its job was planned (ALTER TABLE: ``jobs.SHAPE``) reads nothing:
  the job is planned again (``actors.snapshot.planner``) and goes on after the same key. A
  table the slot no longer streams to the route (dropped, a partition detached from its
  published root, out of the publications) ends its job, recorded done.
* Memory: one chunk per running job (``[snapshot] parallel`` jobs at a time).
"""

from __future__ import annotations

import uuid
from logging import WARNING

import msgspec
import trio

from router.config.router import Config
from router.snapshot.core import PREFIX, SnapshotState, RecentChanges, Watermark, encode_watermark
from router.stream.transactions import Transaction

from ..pipeline.mailbox import Latest
from ..services import log
from ..services.sql import SqlSession
from .jobs import SHAPE, Job, shape_tables
from .planner import INITIAL, JobPlanner
from . import signals
from .reader import TableReader, close_session
from .report import Reporter
from .store import StateStore
from .tables import keys_json
from .windows import Chunk, close_window, observe, open_window, watermark_of

_log = log.get("snapshot")
#: jobs waiting for a driver at most
JOBS = 4096


class BackfillActor:
    def __init__(self, *, cfg: Config, slot: str, db: str, client, confirmed: Latest,
                 resume_initial: bool = False):
        self.cfg = cfg
        self.db = db
        self.slot = slot
        self.confirmed = confirmed
        self.store = StateStore(cfg, client, slot)
        self.resume_initial = resume_initial
        #: where the events go on (a channel, or the next actor's ``mailbox.Inline``)
        self.out = None
        self.chunks: dict[str, Chunk] = {}
        self.open: list[Chunk] = []
        self.report = Reporter("backfill", cfg.log.progress_interval)
        self._jobs_tx, self._jobs_rx = trio.open_memory_channel(JOBS)
        self._initial_left = 0
        self._active = 0  # jobs queued or running
        self._running: set[tuple[str, str]] = set()  # their (route, table)
        self.waiting: dict[tuple, list] = {}  # (route, table) -> signals' [(request, job)]
        self.unstarted: dict[tuple, Job] = {}  # (route, table) -> a signal's job, not taken
        #: tables being backfilled, as the stream names them -> running jobs
        self._watch: dict[tuple[str, str], int] = {}
        self.recent = RecentChanges()
        self.planner = JobPlanner(cfg, slot, db, self.store)
        #: ``caught_up`` (set by the confirm actor) and every backfill job done: what
        #: ``--until-caught-up`` waits for (a snapshot left unfinished is not caught up)
        self.caught_up: trio.Event | None = None
        self.finished = trio.Event()
        self._pumping = trio.Event()
        self._ended = trio.Event()

    # -- the stream ---------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # SQL sessions are opened when a backfill needs them (``JobPlanner``, drivers): a
        # router without backfills keeps only its usual connections.
        # Started before the state topic is read: that read overlaps the rest of the
        # pipeline's start; the stream's events wait in ``handle`` until it is done
        task_status.started()
        try:
            await self._start()
            async with trio.open_nursery() as nursery:
                for _ in range(self.cfg.snapshot.parallel):
                    nursery.start_soon(self._driver)
                nursery.start_soon(self.report.run)
                if self.caught_up is not None:
                    nursery.start_soon(self._finish_when_caught_up)
                self._pumping.set()
                await self._ended.wait()  # the sender runs ``handle`` until it ``end``s
                nursery.cancel_scope.cancel()
        finally:
            await self.planner.close()

    async def _finish_when_caught_up(self) -> None:
        await self.caught_up.wait()
        while self._active:
            await trio.sleep(0.1)
        self.finished.set()

    def end(self) -> None:
        """No more events."""
        self.out.close()
        self._ended.set()

    async def handle(self, events: list) -> None:
        """One batch of the stream's events, and the chunks its watermarks close, sent on."""
        if not self._pumping.is_set():  # the state topic is still being read
            await self._pumping.wait()
        if self._quiet(events):
            await self.out.send(events)
            return
        out = []
        for ev in events:
            out.append(ev)
            if type(ev) is not Transaction:
                continue
            mark = watermark_of(ev, self.slot) if ev.change_count == 1 else None
            if mark is not None:
                chunk = await self._watermark(mark, ev)
                if chunk is not None:
                    out.append(chunk)
            elif self._watch:
                observe(ev, self._watch, self.recent, self.open)
        await self.out.send(out)

    def _quiet(self, events: list) -> bool:
        """No table is watched and no event can be a watermark (a transaction of one
        logical message): the events pass as they are."""
        if self._watch:
            return False
        for ev in events:
            if type(ev) is Transaction and ev.change_count == 1:
                memory = ev.changes.in_memory()
                if memory is None or memory[0].op == "message":
                    return False
        return True

    async def _watermark(self, mark: Watermark, txn: Transaction):
        if mark.kind == "request":
            await self._request(mark.chunk, list(mark.routes), list(mark.tables), mark.keys)
            return None
        chunk = self.chunks.get(mark.chunk)
        if chunk is None:
            return None  # a chunk of an earlier run
        if mark.kind == "low":
            open_window(chunk, self.recent)
            self.open.append(chunk)
            return None
        if mark.kind != "high" or chunk.window is None:
            return None
        self.open.remove(chunk)
        return close_window(chunk, txn, self.recent)

    # -- requests and jobs --------------------------------------------------------------------

    async def _start(self) -> None:
        """Resumes the jobs the state topic (as this run's initial snapshot left it, or
        read now) says are running, and an interrupted initial snapshot."""
        records = self.store.records if self.store.loaded else await self.store.aload()
        running = [p for p in records.values() if p.kind == "backfill" and p.slot == self.slot
                   and p.state == "running"]
        if running or self.resume_initial:
            await self.planner.reload()
        for p in running:
            jobs, problems = await self.planner.plan(p.request, [p.route], [p.table], p.keys,
                                                     p.where)
            if not jobs and not await self.planner.taken(p.route, p.table):
                # dropped or detached while the router was down: nothing left to copy
                log.event(_log, "backfill ends: the table is no longer streamed to the "
                          "route (dropped, detached or out of the publications)",
                          level=WARNING, route=p.route, table=p.table)
                await self.store.aput(msgspec.structs.replace(p, state="done"))
                continue
            for problem in problems:
                log.event(_log, "backfill cannot resume", problem=problem)
            for job in jobs:
                job.last_key, job.rows = p.last_key, p.rows
                self._queue(job)
                log.event(_log, "backfill resumed", route=job.route, table=job.name,
                          after_key=list(p.last_key or ()), rows_done=p.rows)
        if self.resume_initial:
            await self._request(INITIAL, [r.name for r in self.cfg.routes], [])
        await signals.resume_queued(self)

    async def _request(self, request: str, routes: list[str], tables: list[str],
                       keys: tuple = (), quiet: bool = False, where: str = "") -> list[str]:
        """Plans and queues the jobs of a request (only the rows ``where`` matches, when
        given); returns the problems refusing parts."""
        async with self.planner.lock:
            await self.planner.reload()
            fresh, problems, states = await self._plan(request, routes, tables, keys, quiet,
                                                       where, set())
        await self.store.aput_many(states)
        self._enqueue(request, fresh)
        return problems

    async def _plan(self, request: str, routes: list[str], tables: list[str], keys: tuple,
                    quiet: bool, where: str, planned: set,
                    busy: list | None = None) -> tuple[list, list, list]:
        """The new jobs of a request, the problems refusing parts, and the state records to
        write before they are queued (``_enqueue``), from the catalog last read (the
        planner's lock held). ``planned``: the (route, table) of jobs planned but not yet
        queued (several requests recorded together); this request's are added. ``busy``
        takes the jobs of a (route, table) running or planned (else they are left out)."""
        jobs, problems = await self.planner.plan(request, routes, tables, keys, where)
        for problem in problems if not quiet else ():  # (a signal says them its own way)
            log.event(_log, "backfill refused", request=request, problem=problem)
        fresh = []
        for job in jobs:
            seen = self.store.get(SnapshotState("backfill", self.slot, "", route=job.route,
                                           table=job.name))
            if seen is not None and seen.request == request:
                continue  # already known: running (resumed) or done
            if (job.route, job.name) in self._running | planned:
                if busy is None:
                    log.event(_log, "backfill already running", route=job.route, table=job.name)
                else:  # a signal's job waits for it (actors.snapshot.signals)
                    busy.append(job)
                continue
            planned.add((job.route, job.name))
            fresh.append(job)
        states = []
        if request == INITIAL:
            self._initial_left = len(fresh) + sum(
                1 for p in self.store.records.values() if p.kind == "backfill"
                and p.slot == self.slot and p.request == INITIAL and p.state == "running")
            if not self._initial_left:
                states.append(SnapshotState("initial", self.slot, "done"))
        states += [self._progress(job, "running") for job in fresh]
        return fresh, problems, states

    def _enqueue(self, request: str, fresh: list[Job]) -> None:
        for job in fresh:
            self._queue(job)
            log.event(_log, "backfill requested", request=request, route=job.route,
                      table=job.name, key=list(job.key),
                      **({"repair_keys": [list(k) for k in job.keys]} if job.keys else {}))

    def _queue(self, job: Job) -> None:
        try:
            self._jobs_tx.send_nowait(job)
            self._active += 1
            self._running.add((job.route, job.name))
        except trio.WouldBlock:
            log.event(_log, "backfill refused", problem=f"more than {JOBS} jobs waiting",
                      route=job.route, table=job.name)

    def _progress(self, job: Job, state: str) -> SnapshotState:
        return SnapshotState("backfill", self.slot, state, request=job.request, route=job.route,
                        table=job.name, last_key=job.last_key, rows=job.rows, keys=job.keys,
                        where=job.where)

    # -- drivers ------------------------------------------------------------------------------

    async def _driver(self) -> None:
        sql = reader = None
        try:
            async for job in self._jobs_rx:
                try:
                    if sql is None:
                        sql = await SqlSession.connect(self.cfg.source.dsn)
                    if reader is None:
                        reader = await TableReader.open(self.cfg.source.dsn)
                    await self._job(job, sql, reader)
                finally:
                    self._active -= 1
                    self._running.discard((job.route, job.name))
                await signals.next_waiting(self, job)
        finally:
            if sql is not None:
                await close_session(sql)
            if reader is not None:
                await reader.close()

    async def _emit(self, sql: SqlSession, mark: Watermark) -> None:
        await sql.execute("select pg_logical_emit_message(true, $1, $2::text)", PREFIX,
                          encode_watermark(mark).decode())

    async def _durable(self, lsn: int) -> None:
        while self.confirmed.value < lsn:
            if self.confirmed.closed:  # the pipeline is stopping: the chunk is redone next time
                await trio.sleep_forever()
            await self.confirmed.wait_changed()

    async def _job(self, job: Job, sql: SqlSession, reader: TableReader) -> None:
        self.unstarted.pop((job.route, job.name), None)  # taken: read from now on
        watched = (job.table.relation.namespace, job.table.relation.name)
        self._watch[watched] = self._watch.get(watched, 0) + 1
        try:
            await self._chunks(job, sql, reader)
        finally:
            self._watch[watched] -= 1
            if not self._watch[watched]:
                del self._watch[watched]

    async def _chunks(self, job: Job, sql: SqlSession, reader: TableReader) -> None:
        limit = self.cfg.snapshot.chunk_rows if job.key and not job.keys else None
        estimate = await reader.estimate(job.table.table)
        self.report.start(job.name, estimate)
        self.report.add(job.name, job.rows)
        while True:
            cid = uuid.uuid4().hex
            chunk = self.chunks[cid] = Chunk(job)
            try:
                await self._emit(sql, Watermark("low", self.slot, chunk=cid))
                rows: list = []

                async def keep(batch: list) -> None:
                    rows.extend(batch)
                chunk.xip, filenode, shape = await reader.begin_read(
                    job.table.table, SHAPE, shape_tables(job))
                replanned = shape != job.shape
                # gone: dropped, detached, out of the publication: nothing left to copy
                gone = replanned and not await self.planner.replan(job)
                if job.skip and filenode != job.filenode:
                    # rewritten since the initial snapshot's ranges were read: the blocks
                    # no longer hold the rows they held (chunks before this one were read
                    # from the file the ranges are blocks of)
                    job.skip = ()
                    log.event(_log, "backfill reads every block: the table was rewritten",
                              route=job.route, table=job.name)
                select, params = job.table.chunk_select(job.key, job.key_types, job.last_key,
                                                        limit, job.keys, job.skip, job.where)
                failed = "" if replanned else await signals.copy_where(
                    job, reader, select, keep, params)
                if job.keys and not replanned and not failed:
                    chunk.absent = await reader.absent(job.table.absent_select(
                        job.key, job.key_types), keys_json(job.keys))
                await reader.end_read()
                chunk.rows = rows
                await self._emit(sql, Watermark("high", self.slot, chunk=cid))
                await chunk.emitted.wait()
            finally:
                del self.chunks[cid]
            await self._durable(chunk.end_lsn)
            if gone or failed:  # (a where that fails on a row: the job alone fails)
                await (self._ended_gone(job) if gone else signals.where_failed(self, job, failed))
                return
            if chunk.spoiled or replanned:
                continue  # a keyless table changed while it was copied, or new columns: again
            done = limit is None or len(rows) < limit
            if rows and job.key:
                job.last_key = tuple(rows[-1][i] for i in job.row_key)
            job.rows += len(rows)
            self.report.add(job.name, len(rows))
            await self.store.aput(self._progress(job, "done" if done else "running"))
            if done:
                self.report.finish(job.name)
                await self._job_done(job)
                return

    async def _ended_gone(self, job: Job) -> None:
        """The job's table is no longer streamed to its route: recorded done (nothing left
        to copy; the rows copied so far stay in the topic, as the stream's do)."""
        log.event(_log, "backfill ends: the table is no longer streamed to the route "
                  "(dropped, detached or out of the publications)", level=WARNING,
                  route=job.route, table=job.name)
        await self.store.aput(self._progress(job, "done"))
        self.report.finish(job.name)
        await self._job_done(job)

    async def _job_done(self, job: Job) -> None:
        if job.request == INITIAL and self._initial_left > 0:
            self._initial_left -= 1
            if not self._initial_left:
                await self.store.aput(SnapshotState("initial", self.slot, "done"))
                log.event(_log, "initial snapshot finished by backfill", slot=self.slot)


def backfill_stage(cfg: Config, *, slot: str, db: str, client, confirmed: Latest, pending: list,
                   caught_up: trio.Event):
    """The backfill actor (None when the slot sends no logical messages: watermarks could not
    be seen), run in its sender's task (``handle``/``end`` behind ``mailbox.Inline``; the
    caller sets its ``out``), and the event that says the pipeline caught up with every
    backfill done (``caught_up`` without the actor)."""
    if not cfg.source.messages:
        if pending:
            from router.errors import ConfigError

            raise ConfigError("an interrupted initial snapshot is finished by backfill, which "
                              "needs logical messages", path="source.messages")
        return None, caught_up
    actor = BackfillActor(cfg=cfg, slot=slot, db=db, client=client, confirmed=confirmed,
                          resume_initial=bool(pending))
    actor.caught_up = caught_up
    return actor, actor.finished


def finish_initial(actor: BackfillActor | None, tables: list[str]) -> None:
    """The initial snapshot left ``tables`` (rewritten during the copy): ``actor`` finishes it
    by backfill once streaming, as an interrupted one. Without logical messages (no actor)
    it cannot: one line, and the snapshot stays unfinished."""
    if actor is None:
        from router.errors import ConfigError

        raise ConfigError(f"the initial snapshot could not copy {', '.join(tables)}: "
                          "rewritten or truncated while the snapshot ran; it is finished by "
                          "backfill, which needs logical messages", path="source.messages")
    actor.resume_initial = True
