"""The catalog backfill jobs are planned from, read again for every request and every job
whose table changed while it ran.

Rules:

* The tables' shapes (``jobs.table_shapes``: columns and partition parents) are read before
  the catalog: a DDL that commits after that read shows as another shape at a chunk.
* Requests and drivers share one SQL session and one catalog: a request, and a job planned
  again, hold ``lock`` while they read the catalog and plan from it.
* Jobs finishing an interrupted initial snapshot leave out the block ranges it recorded
  done (``jobs.done_ranges``); they copy a table without a key whole.
* One encoder per route and planning: a route's schema or topic is announced once.
* A chunk that finds the table's columns or partition parents changed since its job was
  planned (ALTER TABLE, DETACH/ATTACH PARTITION: ``jobs.SHAPE``) has its job planned again
  from the catalog now (``replan``: columns, key, record schema), to go on after the same
  key. A table the slot no longer streams to the route (dropped, a partition detached from
  its published root, out of the publications) has nothing left to copy; one still
  streamed that can no longer be planned fails the backfill with one line.
"""

from __future__ import annotations

import trio

from router.config.router import Config
from router.errors import SourceError

from ..services import log
from ..services.catalog import load_catalog, load_primary_keys
from ..services.sql import SqlSession
from .column_types import type_names
from .jobs import Job, done_ranges, plan_jobs, route_rows, shape_tables, table_shapes
from .reader import close_session
from .store import StateStore

_log = log.get("snapshot")
#: the request name of the jobs finishing an interrupted initial snapshot
INITIAL = "initial"


class JobPlanner:
    """Plans backfill jobs from the catalog, on a session opened when first needed (a router
    without backfills keeps only its usual connections)."""

    def __init__(self, cfg: Config, slot: str, db: str, store: StateStore):
        self.cfg = cfg
        self.db = db
        self.slot = slot
        self.store = store
        self.sql: SqlSession | None = None
        self.lock = trio.Lock()  # ``self.sql`` and the catalog: requests, drivers
        self.shapes: dict = {}  # ``jobs.table_shapes`` before the catalog was read
        self.catalog = None

    async def close(self) -> None:
        if self.sql is not None:
            await close_session(self.sql)

    async def reload(self) -> None:
        if self.sql is None:
            self.sql = await SqlSession.connect(self.cfg.source.dsn)
        self.shapes = await table_shapes(self.sql)
        self.catalog = await load_catalog(self.sql, self.cfg)

    async def plan(self, request: str, routes: list[str], tables: list[str],
                   keys: tuple = (), where: str = ""):
        jobs, problems = await plan_jobs(self.sql, self.cfg, self.catalog, self.db, request,
                                         routes, tables, type_names,
                                         whole_keyless=request == INITIAL, keys=keys,
                                         where=where)
        if request == INITIAL:
            await done_ranges(self.sql, self.cfg, self.catalog, self.store.records.values(),
                              self.slot, jobs)
        names = await type_names(self.sql, [job.table for job in jobs])
        pks = await load_primary_keys(self.sql) if jobs else {}
        encoders: dict = {}  # one per route: a schema or topic is announced once
        for job in jobs:
            job.shape = tuple(self.shapes.get(t) for t in shape_tables(job))
            job.encoder = encoders.get(job.route)
            if job.encoder is None:
                job.encoder = encoders[job.route] = route_rows(self.cfg, self.catalog, self.db,
                                                               job.route, names, pks)
        return jobs, problems

    async def replan(self, job: Job) -> bool:
        """The table's columns or partition parents changed since the job was planned
        (ALTER TABLE, DETACH/ATTACH PARTITION, DROP TABLE): the job planned again from the
        catalog now (the chunk's lock holds it), to go on after the same key with the
        table's new columns, key and record schema. False: the slot no longer streams the
        table to the route (dropped, detached from the table it was published as, out of
        the publications): the job has nothing left to copy."""
        async with self.lock:
            await self.reload()
            jobs, problems = await self.plan(job.request, [job.route], [job.name], job.keys,
                                             job.where)
            new = next((j for j in jobs if j.route == job.route and j.name == job.name), None)
            if new is None and await self.taken(job.route, job.name):
                raise SourceError(f"backfill of {job.name} for route {job.route}: the table "
                                  "changed and can no longer be backfilled: "
                                  + "; ".join(problems))
        if new is None:
            return False
        for field in ("table", "key", "key_types", "row_key", "encoder", "shape"):
            setattr(job, field, getattr(new, field))
        log.event(_log, "backfill goes on with the table's new columns", route=job.route,
                  table=job.name)
        return True

    async def taken(self, route: str, table: str) -> bool:
        """The slot streams ``table`` to ``route`` (with a key or not), by the catalog last
        read."""
        jobs, _ = await plan_jobs(self.sql, self.cfg, self.catalog, self.db, "", [route],
                                  [table], type_names, whole_keyless=True)
        return bool(jobs)
