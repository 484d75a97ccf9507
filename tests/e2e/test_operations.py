"""What an operator meets: `pgrouter check` on good and broken setups, clear one-line errors
for bad input (config, unreachable services, slot in use), and SIGHUP re-reading the
publications."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.e2e.guarantee import delete_topics, wait_for
from tests.e2e.sources import new_table, source_config
from tests.helpers import ROOT, read_topic, run_router, start_router, write_config

pytestmark = pytest.mark.services


def pgrouter(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def table(pg_dsn, kafka_bootstrap):
    pg, name = new_table(pg_dsn, "ops", "id int primary key, grp int, v text")
    pg.run(f"create publication {name} for table {name}")
    yield pg, name
    pg.drop_slot(name)
    pg.run(f"drop publication if exists {name}, {name}_f")
    pg.run(f"drop table {name}")
    pg.close()
    delete_topics(kafka_bootstrap, [name])


def test_check_passes_a_good_config(table, kafka_bootstrap, tmp_path):
    pg, name = table
    cfg = source_config(tmp_path / "ok.toml", pg.dsn, kafka_bootstrap, name,
                        routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}"]\n')
    proc = pgrouter("check", "-c", str(cfg))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok" in proc.stdout.lower()


def test_check_finds_what_run_refuses_in_metrics_listen(table, kafka_bootstrap, tmp_path):
    """`check` binds the metrics address as `run` will: a port in use, a host not found and
    an address not on this machine are one line each; the IPv6 form `[::1]:port` works."""
    import socket

    pg, name = table
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        for listen, expect in [(f"127.0.0.1:{port}", "Address already in use"),
                               ("no-such-host.invalid:9187", "host not found"),
                               ("192.0.2.77:9187", "Cannot assign requested address"),
                               ("[::1]:0", None)]:
            cfg = source_config(tmp_path / "m.toml", pg.dsn, kafka_bootstrap, name,
                                routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}"]\n',
                                extra=f'[metrics]\nlisten = "{listen}"\n')
            proc = pgrouter("check", "-c", str(cfg))
            lines = [line for line in proc.stdout.splitlines() if "metrics.listen" in line]
            if expect is None:
                assert proc.returncode == 0 and not lines, proc.stdout + proc.stderr
                run = pgrouter("run", "-c", str(cfg), "--until-caught-up")
                assert run.returncode == 0, run.stderr[-2000:]
                continue
            assert proc.returncode == 1 and len(lines) == 1, proc.stdout + proc.stderr
            assert lines[0].startswith("metrics.listen: cannot listen on") and expect in lines[0]
            run = pgrouter("run", "-c", str(cfg), "--until-caught-up")  # run says the same
            assert run.returncode != 0 and expect in run.stderr, run.stderr[-2000:]
    finally:
        taken.close()


def test_check_reports_every_problem_with_its_key(table, tmp_path):
    pg, name = table
    pg.run(f"create table {name}_nokey (a int, b text)")
    try:
        pg.run(f"alter publication {name} add table {name}_nokey")
        cfg = write_config(
            tmp_path / "bad.toml", dsn=pg.dsn, slot=name, publications=[name, "no_such_pub"],
            bootstrap="127.0.0.1:1",
            source_extra="",
            routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}"]\nwhere = "v = \'x\'"\n'
                   f'[[routes]]\nname = "k"\ntables = ["public.{name}_nokey"]\n')
        text = cfg.read_text().replace("create_slot = true", "create_slot = false")
        cfg.write_text(text)
        proc = pgrouter("check", "-c", str(cfg))
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0
        assert "Traceback" not in out
        assert "source.slot" in out                      # missing slot, may not be created
        assert "source.publications[1]" in out           # missing publication
        assert "routes[0]" in out and "replica identity" in out.lower()  # filter on non-key col
        assert "routes[1]" in out                        # no usable replica identity
        assert "kafka" in out.lower()                    # broker unreachable
    finally:
        pg.run(f"drop table {name}_nokey")


@pytest.mark.parametrize("text, where", [
    ("[source]\ndsn = 1\n", "source.dsn"),
    ("[source\n", "not valid TOML"),
    ("", "source"),
])
def test_bad_config_is_one_line_with_the_key(tmp_path, text, where):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    proc = pgrouter("run", "-c", str(cfg))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert where in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_missing_config_file(tmp_path):
    proc = pgrouter("run", "-c", str(tmp_path / "nope.toml"))
    assert proc.returncode == 2 and "cannot read config file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_publication_stops_with_a_clear_message(table, kafka_bootstrap, tmp_path):
    pg, name = table
    cfg = write_config(tmp_path / "c.toml", dsn=pg.dsn, slot=name, publications=["nope_" + name],
                       bootstrap=kafka_bootstrap,
                       routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}"]\n')
    proc = pgrouter("run", "-c", str(cfg), "--until-caught-up")
    assert proc.returncode == 1
    assert f"nope_{name} do not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_slot_in_use_by_another_process_is_reported(table, kafka_bootstrap, tmp_path, monkeypatch):
    pg, name = table
    cfg = source_config(tmp_path / "c.toml", pg.dsn, kafka_bootstrap, name,
                        routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}"]\n')
    first = start_router(cfg, tmp_path / "first.log")
    try:
        wait_for(lambda: pg.run("select 1 from pg_replication_slots where slot_name = %s "
                                "and active", name), timeout=30, what="the first router")
        env_cfg = cfg
        proc = subprocess.run([sys.executable, "-c",
                               "import actors.runner.source as s, sys; s.SLOT_BUSY_WAIT = 1; "
                               "from actors.cli import main; sys.exit(main(sys.argv[1:]))",
                               "run", "-c", str(env_cfg), "--until-caught-up"],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 1
        assert "in use" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        first.terminate()
        first.wait(timeout=60)


def test_unreachable_postgres_is_retried_then_drained_cleanly(kafka_bootstrap, tmp_path):
    cfg = write_config(tmp_path / "c.toml", dsn="postgresql://postgres@127.0.0.1:1/postgres",
                       slot="s", publications=["p"], bootstrap=kafka_bootstrap,
                       routes='[[routes]]\nname = "r"\ntables = ["public.t"]\n')
    proc = start_router(cfg, tmp_path / "r.log")
    wait_for(lambda: "cannot connect" in (tmp_path / "r.log").read_text(), timeout=60,
             what="the router to retry the unreachable server")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    log = (tmp_path / "r.log").read_text()
    assert "restarting after transient failure" in log and "cannot connect" in log
    assert "Traceback" not in log


def test_sighup_rereads_publications(table, kafka_bootstrap, tmp_path):
    pg, name = table
    pg.run(f"alter table {name} replica identity full")
    pg.run(f"create publication {name}_f for table {name} where (grp = 1)")
    cfg = source_config(tmp_path / "c.toml", pg.dsn, kafka_bootstrap, name,
                        routes=f'[[routes]]\nname = "{name}"\npublication = "{name}_f"\n'
                               f'topic = "{name}"\n',
                        source_extra='publication_changes = "poll"')  # what SIGHUP is for
    run_router(cfg)
    proc = start_router(cfg, tmp_path / "r.log")
    def topic_ids():
        return [r["key"]["id"] for r in read_topic(kafka_bootstrap, name, timeout=30)]

    try:
        wait_for(lambda: pg.one("select active from pg_replication_slots where slot_name = %s",
                                name), timeout=60, what="the router to stream")
        pg.run(f"insert into {name} values (1, 1, 'a'), (2, 2, 'b')")
        wait_for(lambda: topic_ids() == [1], timeout=60, what="row 1 in the topic")
        pg.run(f"alter publication {name}_f set table {name} where (grp = 2)")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "publications reloaded" in (tmp_path / "r.log").read_text(),
                 timeout=30, what="the reload")
        pg.run(f"insert into {name} values (3, 1, 'c'), (4, 2, 'd')")
        wait_for(lambda: 4 in topic_ids(), timeout=60, what="row 4 in the topic")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0
    ids = [r["key"]["id"] for r in read_topic(kafka_bootstrap, name)]
    assert ids == [1, 4], "grp = 1 before the reload, grp = 2 after it"


def test_config_routes_take_a_table_with_a_stored_generated_column(table, kafka_bootstrap,
                                                                   tmp_path):
    """PostgreSQL 18 can publish stored generated columns, but a publication without
    ``publish_generated_columns`` does not: ``tables``/``schemas`` routes take the table as
    the slot sends it (they refused to start, asking for the generated column), snapshot and
    stream alike."""
    pg, name = table
    if pg.one("select current_setting('server_version_num')::int") < 180000:
        pytest.skip("stored generated columns are published from PostgreSQL 18 on")
    pg.run(f"create schema {name}_s")
    pg.run(f"create table {name}_s.g (id int primary key, a int, "
           f"b int generated always as (a * 2) stored)")
    pg.run(f"insert into {name}_s.g (id, a) values (1, 1)")
    pg.run(f"alter publication {name} add table {name}_s.g")
    try:
        cfg = source_config(tmp_path / "g.toml", pg.dsn, kafka_bootstrap, name,
                            routes=f'[[routes]]\nname = "t"\ntables = ["{name}_s.g"]\n'
                                   f'topic = "{name}.t"\n'
                                   f'[[routes]]\nname = "s"\nschemas = ["{name}_s"]\n'
                                   f'topic = "{name}.s"\n')
        proc = pgrouter("check", "-c", str(cfg))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        run_router(cfg)  # the initial snapshot
        pg.run(f"insert into {name}_s.g (id, a) values (2, 5)")
        run_router(cfg)
        for topic in (f"{name}.t", f"{name}.s"):
            values = [r["value"] for r in read_topic(kafka_bootstrap, topic)]
            assert [(v["op"], v["after"]) for v in values] == [("r", {"id": 1, "a": 1}),
                                                               ("c", {"id": 2, "a": 5})]
            assert len({v["source"]["schema_id"] for v in values}) == 1
    finally:
        pg.drop_slot(name)
        pg.run(f"drop schema {name}_s cascade")
        delete_topics(kafka_bootstrap, [f"{name}.t", f"{name}.s"])


@pytest.mark.parametrize("slot_pub, expect", [
    ("for table {t} where (grp > 100)",
     "the slot's publications filter INSERT with (grp > 100), narrower than the route's "
     "(grp > 10)"),
    ("for table {t} with (publish = 'insert, update')",
     "the slot's publications do not publish DELETE"),
    ("for table {t} (id, v)", "the slot's publications send only columns ['id', 'v']; "
                              "the route needs ['grp'] too"),
    ("for tables in schema {t}_x", "not in the slot's publications (source.publications)"),
])
def test_a_slot_narrower_than_a_route_is_refused(table, kafka_bootstrap, tmp_path, slot_pub,
                                                 expect):
    """The slot streams what its publications send: a route that needs more (rows, actions,
    columns, tables) would silently miss it, so `check` and `run` refuse, naming the gap."""
    pg, name = table
    pg.run(f"create publication {name}_f for table {name} where (grp > 10)")
    pg.run(f"create schema {name}_x")
    pg.run(f"create publication {name}_slot {slot_pub.format(t=name)}")
    try:
        cfg = write_config(tmp_path / "n.toml", dsn=pg.dsn, slot=name,
                           publications=[f"{name}_slot"], bootstrap=kafka_bootstrap,
                           routes=f'[[routes]]\nname = "r"\npublication = "{name}_f"\n')
        check = pgrouter("check", "-c", str(cfg))
        assert check.returncode == 1, check.stdout
        want = f"source.publications: route 'r', table public.{name}: {expect}"
        assert want in check.stdout, check.stdout
        run = pgrouter("run", "-c", str(cfg), "--until-caught-up")
        assert run.returncode != 0 and expect in run.stderr, run.stderr[-2000:]
        assert "Traceback" not in run.stderr
        assert not pg.run("select 1 from pg_replication_slots where slot_name = %s", name)
    finally:
        pg.run(f"drop publication if exists {name}_slot")
        pg.run(f"drop schema {name}_x")
