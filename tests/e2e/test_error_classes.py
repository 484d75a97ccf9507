"""Bad input and broken environments through the real CLI against the real stack: each
permanent problem is one line on stderr naming what is wrong and where, a non-zero exit and
no traceback, and ``run`` refuses exactly what ``check`` finds (before creating a slot);
transient ones are retried with a line saying so, and ``--until-caught-up`` gives up after
``--retry-timeout``. Roles with password logins and without a walsender entry come from the
dev stack's pg_hba.conf (``devstack.postgres.ensure_hba``)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from devstack.postgres import PASSWORD_ROLE
from router.postgres.dsn import parse
from tests.helpers import ROOT, Pg, read_topic, router_cmd, unique, write_config

pytestmark = pytest.mark.services

PASSWORD = "s3cr et'\\pw"  # a space, a quote and a backslash: libpq's quoting rules matter


def pgrouter(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def error_line(proc: subprocess.CompletedProcess, command: str = "run") -> str:
    """The one line saying what is wrong (log lines before it are allowed; no traceback)."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "unexpected failure" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"pgrouter {command}:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def key_value(server_dsn: str, **override) -> str:
    """The server's DSN in libpq's ``key=value`` form, values quoted as libpq wants."""
    params = {**parse(server_dsn), **override}
    return " ".join(f"{k}='" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
                    for k, v in params.items())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def roles(pg_dsn):
    """A role logging in with a password and one without REPLICATION."""
    pg = Pg(pg_dsn)
    names = {k: unique(f"err_{k}") for k in ("pw", "norepl")}
    pg.run(f"do $$ begin create role {PASSWORD_ROLE} nologin; exception when "
           "duplicate_object then null; end $$")
    pg.run(f"create role {names['pw']} login replication in role {PASSWORD_ROLE} "
           "password %s", PASSWORD)
    pg.run(f"create role {names['norepl']} login")
    yield names
    for name in names.values():
        pg.run(f"drop role {name}")
    pg.close()


@pytest.fixture
def setup(pg_dsn, kafka_bootstrap, tmp_path):
    """A table with a publication; ``config(**kw)`` writes a router config for it. Slots
    and topics made are cleaned up."""
    pg = Pg(pg_dsn)
    name = unique("err")
    pg.run(f"create table {name} (id int primary key, v text)")
    pg.run(f"create publication {name} for table {name}")

    def config(*, dsn=pg_dsn, slot=name, bootstrap=kafka_bootstrap, routes=None,
               source_extra="", kafka_extra="", extra=""):
        routes = routes or f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n' \
                           f'topic = "{name}"\n'
        return write_config(tmp_path / "c.toml", dsn=dsn, slot=slot, publications=[name],
                            bootstrap=bootstrap, routes=routes, source_extra=source_extra,
                            kafka_extra=kafka_extra, extra=extra)

    config.pg, config.name = pg, name
    yield config
    pg.drop_slot(name)
    pg.run(f"drop publication {name}")
    pg.run(f"drop table {name}")
    pg.close()
    _delete_topics(kafka_bootstrap, [name, f"{name}_x"])


def _delete_topics(bootstrap, topics):
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([t for t in topics if t in set(admin.list_topics())])
    finally:
        admin.close()


def slot_exists(pg: Pg, slot: str) -> bool:
    return bool(pg.run("select 1 from pg_replication_slots where slot_name = %s", slot))


# --- item 3: run refuses what check finds ---------------------------------------------------


def test_run_refuses_a_route_to_a_missing_table_like_check(setup):
    name = setup.name
    cfg = setup(routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}", '
                       f'"public.{name}_gone"]\n')
    check = pgrouter("check", "-c", str(cfg))
    assert check.returncode == 1 and "routes[0].tables[1]" in check.stdout
    proc = pgrouter("run", "-c", str(cfg), "--until-caught-up")
    assert proc.returncode == 2
    line = error_line(proc)
    assert "routes[0].tables[1]" in line and f"{name}_gone does not exist" in line
    assert not slot_exists(setup.pg, name), "refused before creating the slot"


# --- item 5: both DSN forms everywhere ------------------------------------------------------


def test_key_value_dsn_with_quoted_password_runs_and_checks(setup, roles, pg_dsn,
                                                             kafka_bootstrap):
    pg, name = setup.pg, setup.name
    pg.run(f"grant select on {name} to {roles['pw']}")
    pg.run(f"alter table {name} owner to {roles['pw']}")  # pgoutput needs no more
    dsn = key_value(pg_dsn, user=roles["pw"], password=PASSWORD)
    cfg = setup(dsn=dsn)
    check = pgrouter("check", "-c", str(cfg))
    assert check.returncode == 0, check.stdout + check.stderr
    for _ in range(2):  # the first run creates the slot, the second delivers the insert
        proc = pgrouter("run", "-c", str(cfg), "--until-caught-up", timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "password=***" in proc.stderr and "s3cr" not in proc.stderr
        pg.run(f"insert into {name} values (1, 'a')") if _ == 0 else None
    assert [r["key"]["id"] for r in read_topic(kafka_bootstrap, name)] == [1]


def test_apply_takes_a_key_value_dsn(pg_dsn, kafka_bootstrap, tmp_path):
    cfg = tmp_path / "apply.toml"
    db = unique("nodb")
    cfg.write_text(f"""
[kafka]
bootstrap_servers = "{kafka_bootstrap}"
transactions_topic = "{db}.tx"
[target]
dsn = "{key_value(pg_dsn, dbname=db)}"
origin = "{db}"
""")
    proc = pgrouter("apply", "-c", str(cfg), "--until-caught-up")
    assert proc.returncode == 1
    line = error_line(proc, "apply")
    assert "target.dsn" in line and f'database "{db}" does not exist' in line


# --- items 6 and 8: permanent problems are one line, never retried ----------------------------


@pytest.mark.parametrize("case", ["wrong_password", "missing_database", "no_replication"])
def test_login_problems_are_one_line_for_run_and_check(setup, roles, pg_dsn, case):
    dsn, expect = {
        "wrong_password": (key_value(pg_dsn, user=roles["pw"], password="wrong"),
                           "password authentication failed"),
        "missing_database": (key_value(pg_dsn, dbname="no_such_db_err"),
                             'database "no_such_db_err" does not exist'),
        "no_replication": (key_value(pg_dsn, user=roles["norepl"]), "REPLICATION"),
    }[case]
    cfg = setup(dsn=dsn)
    started = time.monotonic()
    proc = pgrouter("run", "-c", str(cfg))  # no --until-caught-up: must not retry either
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = error_line(proc)
    assert "source.dsn" in line and expect in line
    assert time.monotonic() - started < 30
    check = pgrouter("check", "-c", str(cfg))
    assert check.returncode == 1 and "Traceback" not in check.stdout + check.stderr
    assert f"source.dsn: " in check.stdout and expect in check.stdout
    assert not slot_exists(setup.pg, setup.name)


@pytest.mark.parametrize("field, value, where", [
    ("slot", "Bad-Slot", "source.slot"),
    ("dsn", "postgresql//127.0.0.1/postgres", "source.dsn"),
    ("dsn", "host=127.0.0.1 colour=blue", "source.dsn"),
    ("bootstrap", "localhost:notaport", "kafka.bootstrap_servers"),
    ("source_extra", "status_interval = -1", "source.status_interval"),
    ("source_extra", "memory_limit = -5", "source.memory_limit"),
    ("source_extra", 'spill_dir = "/nonexistent/spill"', "source.spill_dir"),
    ("source_extra", 'spill_dir = "/proc"', "source.spill_dir"),  # a directory no one writes
])
def test_bad_settings_are_one_line_for_run_and_check(setup, field, value, where):
    cfg = setup(**{field: value})
    if value.startswith("status_interval"):  # replaces the one write_config sets
        cfg.write_text(cfg.read_text().replace("status_interval = 0.5\n", "", 1))
    proc = pgrouter("run", "-c", str(cfg), "--until-caught-up")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert where in error_line(proc)
    check = pgrouter("check", "-c", str(cfg))
    assert check.returncode != 0 and where in check.stdout + check.stderr
    assert "Traceback" not in check.stdout + check.stderr
    assert not slot_exists(setup.pg, setup.name)


@pytest.mark.parametrize("settings, expect", [
    ("replication_factor = 3", "replication factor"),
    ('configs = {"no.such.config" = "1"}', "no.such.config"),
])
def test_topics_kafka_would_refuse_are_found_by_check_and_run(setup, settings, expect):
    name = setup.name
    cfg = setup(routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}"]\n'
                       f'topic = "{name}_x"\ntopic_settings = {{ {settings} }}\n')
    check = pgrouter("check", "-c", str(cfg))
    assert check.returncode == 1 and "routes[0].topic_settings" in check.stdout
    assert expect in check.stdout
    proc = pgrouter("run", "-c", str(cfg), "--until-caught-up")
    assert proc.returncode == 2
    line = error_line(proc)
    assert "routes[0].topic_settings" in line and expect in line
    assert not slot_exists(setup.pg, name)


# --- item 9: topic_settings of a topic that exists ------------------------------------------


def test_check_warns_when_an_existing_topic_differs_from_its_settings(setup, kafka_bootstrap):
    from kafka import KafkaAdminClient

    name = setup.name
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics({name: {"num_partitions": 1, "replication_factor": 1,
                                    "configs": {"retention.ms": "3600000"}}})
    finally:
        admin.close()
    cfg = setup(routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}"]\ntopic = "{name}"\n'
                       'topic_settings = { partitions = 3, configs = { "retention.ms" = '
                       '"86400000" } }\n')
    check = pgrouter("check", "-c", str(cfg))
    assert check.returncode == 0, check.stdout + check.stderr
    warning = [ln for ln in check.stdout.splitlines() if "warning" in ln]
    assert len(warning) == 1, check.stdout
    assert warning[0].startswith("routes[0].topic_settings: warning: topic")
    assert name in warning[0] and "1 partitions" in warning[0] and "3" in warning[0]
    assert "retention.ms=3600000" in warning[0]


# --- item 6: transient problems are retried, said at once, and bounded ----------------------


def test_kafka_down_is_logged_within_seconds_and_retried(setup, tmp_path):
    cfg = setup(bootstrap=f"127.0.0.1:{closed_port()}")
    log = tmp_path / "r.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(router_cmd(cfg), stdout=fh, stderr=subprocess.STDOUT,
                                cwd=ROOT)
    try:
        deadline = time.monotonic() + 15
        while "restarting after transient failure" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert "Kafka" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in log.read_text()


def test_until_caught_up_gives_up_after_the_retry_timeout(setup):
    cfg = setup(bootstrap=f"127.0.0.1:{closed_port()}")
    started = time.monotonic()
    proc = pgrouter("run", "-c", str(cfg), "--until-caught-up", "--retry-timeout", "3")
    assert proc.returncode == 1
    line = error_line(proc)
    assert "gave up after" in line and "--retry-timeout 3" in line and "Kafka" in line
    assert time.monotonic() - started < 30


# --- item 10: a slot this run created does not outlive a failed start -----------------------


def test_a_refused_kafka_setting_creates_no_slot(setup):
    """librdkafka refuses a setting outside its range when the producer is built, which is
    before the slot is made: nothing is left behind."""
    pg, name = setup.pg, setup.name
    cfg = setup(kafka_extra='client = "librdkafka"\n[kafka.settings]\nlinger_ms = 1000000\n',
                extra='[snapshot]\nmode = "never"\n')
    proc = pgrouter("run", "-c", str(cfg))
    assert proc.returncode == 2
    line = error_line(proc)
    assert "kafka.settings" in line and "queue.buffering.max.ms" in line
    assert "replication slot created" not in proc.stderr
    assert not slot_exists(pg, name)


#: ``pgrouter`` with one start-up step after the slot is made failing, injected from the
#: test side (no setting of pgrouter's can make it fail)
FAILING_AFTER_THE_SLOT = """
import sys
from router.errors import ConfigError
from actors.pipeline import definitions_state

async def refuse(*args, **kwargs):
    raise ConfigError("refused after the slot was made (injected)", path="kafka.settings")

definitions_state.for_pipeline = refuse
from actors.cli import main
sys.exit(main())
"""


def test_slot_created_by_a_failed_start_is_dropped(setup):
    """A start that fails after it created the slot, before anything streamed from it,
    drops the slot again. (An initial snapshot's slot is kept on failure: the next run
    finishes the snapshot by backfill.)"""
    pg, name = setup.pg, setup.name
    cfg = setup(extra='[snapshot]\nmode = "never"\n')
    proc = subprocess.run([sys.executable, "-c", FAILING_AFTER_THE_SLOT, "run", "-c", str(cfg)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "injected" in error_line(proc)
    assert "replication slot created" in proc.stderr
    assert "dropped the replication slot this run created" in proc.stderr
    assert not slot_exists(pg, name)


# --- item 8: a second SIGTERM ---------------------------------------------------------------


def test_second_sigterm_is_one_line(setup):
    """The first signal asks for a drain while the router waits for a broker that accepts
    connections but never answers; the second aborts: one line, exit 1, no traceback."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        cfg = setup(bootstrap=f"127.0.0.1:{silent.getsockname()[1]}")
        proc = subprocess.Popen(router_cmd(cfg), stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            silent.settimeout(30)
            held = [silent.accept()[0]]  # the router now waits for Kafka in a thread
            proc.send_signal(signal.SIGTERM)
            # the second signal only once the first was taken (two signals sent close
            # together can arrive as one)
            seen = []
            for line in proc.stderr:
                seen.append(line)
                if "draining" in line:
                    break
            assert seen and "draining" in seen[-1], "".join(seen)[-3000:]
            proc.send_signal(signal.SIGTERM)
            _, rest = proc.communicate(timeout=60)
            stderr = "".join(seen) + rest
            for conn in held:
                conn.close()
        finally:
            if proc.poll() is None:
                proc.kill()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
    assert proc.returncode == 1, stderr[-3000:]
    assert "second signal" in error_line(done)
