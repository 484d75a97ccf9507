"""The documented shape of ``/api/status`` (docs/console.md), as msgspec Structs that refuse
an unknown field: decoding a document with ``type=RunStatus`` is the schema test."""

from __future__ import annotations

import msgspec


class Problem(msgspec.Struct, forbid_unknown_fields=True):
    ts: float
    level: str
    logger: str
    msg: str
    fields: dict


class State(msgspec.Struct, forbid_unknown_fields=True):
    ready: bool
    reason: str
    since: float
    restarts: int
    problem: Problem | None


class Slot(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    active: bool | None
    confirmed_lsn: str | None
    server_lsn: str | None
    lag_bytes: int | None
    lag_seconds: float
    retained_wal_bytes: int | None
    wal_status: str | None
    safe_wal_bytes: int | None
    sampled_at: float | None
    lag_warning: bool
    history: list[tuple[float, int, float]]


class RouteTable(msgspec.Struct, forbid_unknown_fields=True):
    table: str
    row_filter: str | None
    columns: list[str]
    publication: str | None  # null for a `tables` route, never absent (docs/console.md)


class Topic(msgspec.Struct, forbid_unknown_fields=True):
    topic: str
    records: int
    bytes: int


class Route(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    source: dict[str, list[str] | bool]
    tables: list[RouteTable]
    operations: list[str]
    topic: str
    topics: list[Topic]
    records: int
    bytes: int
    records_per_s: float
    bytes_per_s: float
    last_commit_time: str | None
    dropped: int


class Job(msgspec.Struct, forbid_unknown_fields=True):
    kind: str
    table: str
    rows: int
    estimated_rows: int
    done: bool
    percent: float | None
    rows_per_s: float
    eta_s: float | None


class Signal(msgspec.Struct, forbid_unknown_fields=True):
    request: str
    route: str
    table: str
    state: str
    problem: str | None
    ts: float


class Kafka(msgspec.Struct, forbid_unknown_fields=True):
    client: str
    delivery: str
    format: str
    bootstrap_servers: str | list[str]
    in_flight: int


class Actions(msgspec.Struct, forbid_unknown_fields=True):
    backfill: bool


class Leadership(msgspec.Struct, forbid_unknown_fields=True):
    group: str
    topic: str
    role: str
    client_id: str
    member_id: str | None
    term: int


class RunStatus(msgspec.Struct, forbid_unknown_fields=True):
    """``/api/status`` of ``pgrouter run``, schema 1 (docs/console.md)."""
    schema: int
    kind: str
    version: str
    name: str
    now: float
    state: State
    slot: Slot
    routes: list[Route]
    jobs: list[Job]
    signals: list[Signal]
    kafka: Kafka
    problems: list[Problem]
    config: dict
    actions: Actions
    ha: Leadership | None = None
    csrf: str | None = None
