"""What must hold before the router streams, checked by one code path for ``pgrouter check``
(which prints every finding) and ``pgrouter run`` (which refuses to start on the first error,
before it creates a slot or a topic, and logs the warnings).

Rules:

* A finding is ``(path, message)`` with the config key it concerns, plus the router error
  ``run`` raises for it (``ConfigError`` unless a more telling type exists:
  ``PublicationMissing``, ``SlotMissing``, ``PrivilegeMissing``) or ``warning``.
* PostgreSQL: ``wal_level``; the role may stream (superuser or REPLICATION); the slot (exists
  or may be created, pgoutput, this database, not in use — ``run`` waits for a busy slot
  instead); the slot's and the routes' publications; every route problem of
  ``actors.services.catalog.route_findings`` (a table that does not exist, filters and column
  lists that do not fit, the slot's publications hiding rows…; replica identities that make
  PostgreSQL refuse UPDATE/DELETE are warnings, as PostgreSQL accepts the publication);
  every topic name a route can produce (``actors.services.topic_names``).
* The machine: ``source.spill_dir`` exists and is writable.
* Kafka: every topic the routes produce today (and the schema, messages and transactions
  topics) is validated by the broker itself with ``CreateTopics(validate_only)`` —
  replication factor above the broker count, unknown or invalid topic configs, names Kafka
  refuses. A topic that exists already keeps its partitions and configs (pgrouter never
  alters a topic): a difference from ``topic_settings`` is a warning naming the topic.
* Failing to reach a service is not a finding for ``run`` (it retries): ``SourceUnavailable``
  and ``SinkUnavailable`` propagate; ``check`` turns them into findings.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import tempfile
from typing import NamedTuple

import asyncpg
import trio
from router.config.router import Config
from router.errors import (ConfigError, PgRouterError, PrivilegeMissing, PublicationMissing,
                           SinkError, SinkUnavailable, SlotMissing, kafka_unusable)
from router.postgres.identifiers import quote_ident
from router.config.kafka_settings import KAFKA_PYTHON, parse_bootstrap_servers, translate
from router.routing.publications import Catalog
from router.formats.record_format import record_format

from . import log
from .catalog import build_route_specs, load_catalog, route_findings, routed_tables
from .route_checks import transform_findings
from . import failover, slots
from ..kafka.versions import remember_api_version
from .sql import SqlSession, source_error
from .topic_names import route_topic_problems

_log = log.get("preflight")
#: seconds a Kafka admin request (and the first contact) may take before Kafka counts as down
KAFKA_TIMEOUT = 5.0
class Finding(NamedTuple):
    path: str
    message: str
    error: type[PgRouterError] | None = ConfigError  # None: a warning

    @property
    def warning(self) -> bool:
        return self.error is None

    def line(self) -> str:
        return f"{self.path}: {'warning: ' if self.warning else ''}{self.message}"


class Topic(NamedTuple):
    name: str
    path: str  # the config key whose settings it takes
    partitions: int
    replication_factor: int
    configs: dict[str, str]


async def startup_checks(sql: SqlSession, cfg: Config, slot: str, *,
                         log_warnings: bool) -> Catalog:
    """What ``pgrouter run`` checks before each start: the first error is raised as its
    router error, warnings are logged (when asked). Returns the catalog it read. When route
    publications are followed at their WAL position (``publication_changes`` in mode "wal"),
    one dropped by now is a warning: the slot's backlog may still use it."""
    from .publication_mode import mode

    followed = await mode(sql, cfg, slot, install=False) == "wal"
    findings, catalog = await source_findings(sql, cfg, slot, slot_busy=False,
                                              followed_publications=followed)
    # the listener is the router's own by now (bound before the checks): not checked again
    findings += local_findings(cfg, listen=False)
    refuse(findings)  # before asking Kafka about topics that may not even have legal names
    findings += await trio.to_thread.run_sync(kafka_findings, cfg, planned_topics(cfg, catalog))
    findings += await trio.to_thread.run_sync(registry_findings, cfg)
    refuse(findings)
    for f in findings if log_warnings else ():
        log.event(_log, "warning", level=logging.WARNING, path=f.path, problem=f.message)
    return catalog


def refuse(findings: list[Finding]) -> None:
    """Raise the first error finding as its router error; the line says how many more."""
    errors = [f for f in findings if not f.warning]
    if errors:
        first = errors[0]
        more = (f" (and {len(errors) - 1} more problem(s): pgrouter check lists them)"
                if len(errors) > 1 else "")
        raise first.error(f"{first.path}: {first.message}{more}")


async def source_findings(sql: SqlSession, cfg: Config, slot: str, *, slot_busy: bool = True,
                          followed_publications: bool = False) -> tuple[list[Finding], Catalog]:
    try:
        return await _source_findings(sql, cfg, slot, slot_busy, followed_publications)
    except asyncpg.PostgresError as exc:  # e.g. a catalog the role may not read
        raise source_error(exc, "source.dsn: a check query failed") from exc


async def _source_findings(sql: SqlSession, cfg: Config, slot: str, slot_busy: bool,
                           followed_publications: bool) -> tuple[list[Finding], Catalog]:
    src = cfg.source
    out: list[Finding] = []
    wal_level = await sql.fetchval("select current_setting('wal_level')")
    if wal_level != "logical":
        out.append(Finding("source.dsn", f"the server has wal_level={wal_level}; logical "
                                         "decoding needs wal_level=logical (and a restart)"))
    version = int(await sql.fetchval("select current_setting('server_version_num')"))
    highest = 4 if version >= 160000 else 3 if version >= 150000 else 2 if version >= 140000 else 1
    if src.proto_version > highest:
        out.append(Finding("source.proto_version", f"PostgreSQL {version // 10000} supports "
                                                   f"pgoutput protocol {highest} at most"))
    try:  # what this server version lacks (standby decoding, failover slots)
        await failover.check_server(sql, src, version)
        await failover.check_slot(sql, slot, src.failover)
    except ConfigError as exc:
        out.append(Finding(exc.path or "source", str(exc).removeprefix(f"{exc.path}: ")))
    role = (await sql.fetch("select rolname, rolsuper or rolreplication as may_stream "
                            "from pg_roles where rolname = current_user"))[0]
    if not role["may_stream"]:
        out.append(Finding("source.dsn", f"role {role['rolname']!r} may not stream a "
                                         "replication slot: it needs the REPLICATION "
                                         f"attribute (ALTER ROLE {quote_ident(role['rolname'])} "
                                         "REPLICATION) or superuser", PrivilegeMissing))
    db = await sql.fetchval("select current_database()")
    s = await slots.row(sql, slot)
    if s is None:
        if not src.create_slot:
            out.append(Finding("source.slot", f"replication slot {slot!r} does not exist "
                                              "(set source.create_slot = true to create it)",
                               SlotMissing))
    else:
        if s["plugin"] != "pgoutput":
            out.append(Finding("source.slot", f"slot {slot!r} uses plugin {s['plugin']}, "
                                              "not pgoutput"))
        if s["database"] != db:
            out.append(Finding("source.slot", f"slot {slot!r} belongs to database "
                                              f"{s['database']}, the DSN connects to {db}"))
        if s["active"] and slot_busy:
            out.append(Finding("source.slot", f"slot {slot!r} is in use by process "
                                              f"{s['active_pid']}"))
    catalog = await load_catalog(sql, cfg, strict=False)
    for j, p in enumerate(src.publications):
        if p not in catalog.publications:
            out.append(Finding(f"source.publications[{j}]",
                               f"publication(s) {p} do not exist in database {db}",
                               PublicationMissing))
    out.extend(Finding(path, message) for path, message in route_topic_problems(cfg, catalog))
    out.extend(Finding(path, message) for path, message in await transform_findings(
        sql, cfg, catalog))
    seen = {(f.path, f.message) for f in out}
    for path, message, warning in route_findings(
            cfg, catalog, missing_publications_warn=followed_publications):
        if (path, message) not in seen:
            seen.add((path, message))
            out.append(Finding(path, message, None if warning else ConfigError))
    return out, catalog


def local_findings(cfg: Config, *, listen: bool = True) -> list[Finding]:
    """What this machine must provide: the spill directory, the Kafka client's codec, the
    metrics endpoint's address (unless ``listen`` is false)."""
    out = []
    if cfg.kafka.client == "kafka-python":
        from ..kafka.kafka_python import check_codec

        try:
            check_codec(translate(dict(cfg.kafka.settings), KAFKA_PYTHON).get("compression_type"))
        except ConfigError as exc:
            out.append(Finding(exc.path or "kafka.settings", str(exc).removeprefix(
                f"{exc.path}: ")))
    return out + _spill_dir_findings(cfg) + (_listen_findings(cfg) if listen else [])


def _listen_findings(cfg: Config) -> list[Finding]:
    """The metrics endpoint's address: free, on this machine, resolvable (as ``run`` binds
    it)."""
    if not cfg.metrics.listen:
        return []
    from router.config.router import parse_listen

    from .http import probe

    host, port = parse_listen(cfg.metrics.listen)
    try:
        probe(host, port)
    except ConfigError as exc:
        message = str(exc).removeprefix("metrics.listen: ")
        if isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EADDRINUSE \
                and _pgrouter_answers(host, port):
            return [Finding("metrics.listen", f"{message}: a running pgrouter answers there "
                            "(this config's router, or another one)", None)]
        return [Finding("metrics.listen", message)]
    return []


def _pgrouter_answers(host: str, port: int) -> bool:
    import urllib.request

    shown = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{shown}:{port}/healthz", timeout=2) as resp:
            return resp.read() == b"ok\n"
    except OSError:
        return False


def _spill_dir_findings(cfg: Config) -> list[Finding]:
    spill_dir = cfg.source.spill_dir
    if spill_dir is None:
        return []
    if not os.path.isdir(spill_dir):
        return [Finding("source.spill_dir", f"{spill_dir} is not a directory (large "
                                            "transactions spill there)")]
    try:
        with tempfile.TemporaryFile(dir=spill_dir):
            pass
    except OSError as exc:
        return [Finding("source.spill_dir", f"cannot write to {spill_dir}: {exc.strerror}")]
    return []


def planned_topics(cfg: Config, catalog: Catalog | None) -> list[Topic]:
    """Every topic the routes produce for the tables that exist now, plus the router's own
    (only those without a ``catalog``)."""
    topics: dict[str, Topic] = {}
    specs = build_route_specs(cfg, catalog, skip_missing=True) if catalog is not None else []
    tables = routed_tables(cfg, catalog) if catalog is not None else []
    for i, (route, spec, found) in enumerate(zip(cfg.routes, specs, tables)):
        if spec is None or spec.outbox is not None:
            continue  # its publication does not exist (route_problems); outbox: from rows
        ts = route.topic_settings
        for schema, table in sorted(found):
            try:
                name = spec.topic_for(schema, table)
            except ConfigError:
                continue  # a name Kafka refuses: reported by route_topic_problems
            topics.setdefault(name, Topic(name, f"routes[{i}].topic_settings", ts.partitions,
                                          ts.replication_factor, dict(ts.configs)))
    rf = max((r.topic_settings.replication_factor for r in cfg.routes), default=1)
    k = cfg.kafka
    # the state topic and the committed-LSN topic hold the last record per key only while
    # compacted: one made by hand with cleanup.policy=delete loses an unfinished initial
    # snapshot's "started" record (its tables never copied) or the committed LSN
    compact = {"cleanup.policy": "compact"}
    for name, path, configs in ((k.schema_topic, "kafka.schema_topic", compact),
                                (k.messages_topic, "kafka.messages_topic", {}),
                                (k.transactions_topic, "kafka.transactions_topic", {}),
                                (cfg.snapshot.state_topic, "snapshot.state_topic", compact),
                                (k.committed_lsn_topic if k.exactly_once else "",
                                 "kafka.committed_lsn_topic", compact)):
        if name:
            topics.setdefault(name, Topic(name, path, 1, rf, configs))
    return list(topics.values())


def kafka_admin(cfg: Config):
    """A kafka-python admin client with the config's security settings; Kafka that does not
    answer within ``KAFKA_TIMEOUT`` is ``SinkUnavailable``."""
    from kafka import KafkaAdminClient

    probe_kafka(cfg.kafka.bootstrap_servers)
    settings = translate(dict(cfg.kafka.settings), KAFKA_PYTHON)
    security = {k: v for k, v in settings.items()
                if k.startswith(("security_", "sasl_", "ssl_")) or k == "client_id"}
    timeout_ms = int(KAFKA_TIMEOUT * 1000)
    try:
        admin = KafkaAdminClient(bootstrap_servers=cfg.kafka.bootstrap_servers,
                                 request_timeout_ms=timeout_ms, bootstrap_timeout_ms=timeout_ms,
                                 **security)
    except Exception as exc:  # noqa: BLE001 — whatever the client raises, Kafka is not there
        raise SinkUnavailable(f"kafka.bootstrap_servers: Kafka not reachable at "
                              f"{cfg.kafka.bootstrap_servers}: {exc}") from exc
    version = getattr(getattr(admin, "_manager", None), "broker_version", None)
    remember_api_version(cfg.kafka.bootstrap_servers, version)  # learnt while bootstrapping
    return admin


def probe_kafka(bootstrap_servers) -> None:
    """A refused or unroutable address fails here within ``KAFKA_TIMEOUT`` / 2 and says so,
    rather than after the admin client's whole bootstrap wait."""
    errors = []
    for host, port in parse_bootstrap_servers(bootstrap_servers):
        try:
            socket.create_connection((host, port), timeout=KAFKA_TIMEOUT / 2).close()
            return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
    raise SinkUnavailable(f"kafka.bootstrap_servers: Kafka not reachable: {'; '.join(errors)}")


def registry_findings(cfg: Config) -> list[Finding]:
    """``format = "avro"``: the schema registry answers (unreachable: retried like Kafka;
    credentials or URL refused: an error)."""
    if not record_format(cfg.kafka).registers or cfg.kafka.registry is None:
        return []
    from ..kafka.registry import RegistryClient

    try:
        RegistryClient(cfg.kafka.registry).ping()
    except SinkError as exc:
        return [Finding("kafka.registry.url", str(exc), type(exc))]
    except (OSError, ValueError) as exc:  # TLS files that cannot be read
        return [Finding("kafka.registry", f"schema registry client: {exc}")]
    return []


def kafka_findings(cfg: Config, topics: list[Topic]) -> list[Finding]:
    """Blocking (run it in a thread): the broker's verdict on the topics to create, and how
    existing topics differ from their settings; asked with the library the router produces
    with (``actors.kafka.admin``)."""
    admin = _admin(cfg)
    try:
        with kafka_unusable("kafka.bootstrap_servers: Kafka admin request failed: "):
            existing = admin.topics([t.name for t in topics])
            out = []
            new = [t for t in topics if t.name not in existing]
            if cfg.kafka.create_topics and new:
                by_name = {t.name: t for t in new}
                for name, reason in admin.refusals(new):
                    t = by_name.get(name)
                    out.append(Finding(t.path if t else "kafka",
                                       f"Kafka refuses topic {name!r}: {reason}"))
            out += _compare_existing(admin, [t for t in topics if t.name in existing])
            return out
    finally:
        admin.close()


def _admin(cfg: Config):
    from ..kafka.admin import KafkaPythonAdmin, RdKafkaAdmin

    if cfg.kafka.client != "librdkafka":
        return KafkaPythonAdmin(kafka_admin(cfg))
    probe_kafka(cfg.kafka.bootstrap_servers)
    try:
        return RdKafkaAdmin(cfg.kafka.bootstrap_servers, dict(cfg.kafka.settings),
                            KAFKA_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 — e.g. a setting librdkafka refuses
        raise SinkUnavailable(f"kafka.bootstrap_servers: Kafka not reachable at "
                              f"{cfg.kafka.bootstrap_servers}: {exc}") from exc


def _compare_existing(admin, topics: list[Topic]) -> list[Finding]:
    if not topics:
        return []
    out = []
    partitions = admin.partitions([t.name for t in topics])
    with_configs = [t.name for t in topics if t.configs]
    configs = admin.configs(with_configs) if with_configs else {}
    for t in topics:
        diffs = []
        have = partitions.get(t.name)
        if have is not None and have != t.partitions:
            diffs.append(f"{have} partitions, topic_settings say {t.partitions}")
        current = configs.get(t.name, {})
        for key, want in sorted(t.configs.items()):
            value = current.get(key)
            if value != str(want):
                diffs.append(f"{key}={value}, topic_settings say {want}")
        if diffs:
            out.append(Finding(t.path, f"topic {t.name!r} exists with {'; '.join(diffs)} "
                                       "(pgrouter does not change existing topics)", None))
    return out
