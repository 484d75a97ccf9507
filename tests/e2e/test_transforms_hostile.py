"""Column transforms where they are easy to get wrong, against PostgreSQL's own values and
read by a plain confluent-kafka consumer: a partitioned table published via its root (the
route and the transform name the root), a hash of every kind of type equal to
``encode(sha256(convert_to(salt || value::text, 'UTF8')), 'hex')`` computed by PostgreSQL,
NULL staying NULL, truncate and mask counting characters of multibyte UTF-8, and an UPDATE
leaving a TOASTed hashed column unchanged (neither its raw value nor a hash of a sentinel)."""

from __future__ import annotations

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import drop_made, new_table, source_config
from tests.helpers import Pg, read_topic, run_router, unique

pytestmark = pytest.mark.services

SALT_ENV = "PGROUTER_TEST_HOSTILE_SALT"
HASHED = ("email", "n", "ts", "b", "a", "f", "j", "big")


def test_partition_root_types_toast_and_multibyte(pg_dsn, kafka_bootstrap, tmp_path,
                                                  monkeypatch):
    salt = "sé-☃"
    monkeypatch.setenv(SALT_ENV, salt)
    pg = Pg(pg_dsn)
    name = unique("xfh")
    topic = f"{name}.t"
    pg.run(f"create table {name} (id int primary key, email text, n numeric, ts timestamptz, "
           "b bytea, a int[], f float8, j jsonb, big text, note text, code text) "
           "partition by range (id)")
    pg.run(f"create table {name}_p1 partition of {name} for values from (0) to (1000)")
    pg.run(f"alter table {name}_p1 alter column big set storage external")
    pg.run(f"create publication {name} for table {name} with (publish_via_partition_root)")
    routes = (f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\ntopic = "{topic}"\n'
              f'[[routes.transforms]]\nkind = "hash"\ncolumns = ["public.{name}.email", '
              f'"n", "ts", "b", "a", "f", "j", "big"]\nsalt_env = "{SALT_ENV}"\n'
              '[[routes.transforms]]\nkind = "truncate"\ncolumns = ["note"]\nchars = 2\n'
              '[[routes.transforms]]\nkind = "mask"\ncolumns = ["code"]\nchars = 3\n')
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name, routes=routes)
    try:
        run_router(cfg, timeout=300)
        pg.run(f"insert into {name} values (1, 'a@b', 1.50, '2024-01-02 03:04:05.6+02', "
               "'\\x00ff', '{1,NULL,3}', 0.1, '{\"k\": [1, \"é\"]}', repeat('z', 9000), "
               "'é😀x', 'ü'), (2, null, null, null, null, null, null, null, null, null, null)")
        pg.run(f"update {name} set note = 'ab' where id = 1")  # big: unchanged TOAST
        run_router(cfg)
        rows = [r["value"]["after"] for r in read_topic(kafka_bootstrap, topic)]
        assert [r["id"] for r in rows] == [1, 2, 1]
        expected = pg.run(
            "select " + ", ".join(
                f"encode(sha256(convert_to(%s || {c}::text, 'UTF8')), 'hex')" for c in HASHED)
            + f" from {name} order by id", *([salt] * len(HASHED)))
        for row, want in zip(rows[:2], expected):
            assert tuple(row[c] for c in HASHED) == want
        assert (rows[0]["note"], rows[0]["code"]) == ("é😀", "***")
        assert all(rows[1][c] is None for c in HASHED + ("note",))
        # the update: big is unchanged TOAST, sent neither raw nor hashed as a value
        update = read_topic(kafka_bootstrap, topic)[2]["value"]
        assert "big" not in rows[2] and update["unchanged_toast"] == ["big"]
        assert "z" * 20 not in str(update) and expected[0][-1] not in str(update)
        assert rows[2]["note"] == "ab"
    finally:
        drop_made(pg, name, if_exists=False)
        delete_topics(kafka_bootstrap, [topic])


@pytest.mark.parametrize("case", ["unset", "missing", "empty", "newline", "directory",
                                  "not-utf8-file", "not-utf8-env"])
def test_an_unusable_salt_is_one_line(case, pg_dsn, kafka_bootstrap, tmp_path):
    """A salt that is not there or not UTF-8 text (PostgreSQL's ``convert_to(salt || …)``
    cannot hold it) stops ``check`` and ``run`` with one line naming the variable or the file,
    no traceback, before any slot is made."""
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT, router_cmd

    pg, name = new_table(pg_dsn, "xfs", "id int primary key, email text")
    pg.run(f"create publication {name} for table {name}")
    path = tmp_path / "salt"
    env = {k: v for k, v in os.environ.items() if k != SALT_ENV}
    where = f'salt_file = "{path}"'
    if case == "unset":
        where = f'salt_env = "{SALT_ENV}"'
    elif case == "not-utf8-env":
        where = f'salt_env = "{SALT_ENV}"'
        env = {**env, SALT_ENV: b"s\xffx".decode("utf-8", "surrogateescape")}
    elif case == "directory":
        path.mkdir()
    elif case != "missing":
        path.write_bytes({"empty": b"", "newline": b"\n", "not-utf8-file": b"s\xffx\n"}[case])
    routes = (f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
              f'[[routes.transforms]]\nkind = "hash"\ncolumns = ["email"]\n{where}\n')
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name, routes=routes)
    try:
        for cmd in ([sys.executable, "-m", "actors.cli", "check", "-c", str(cfg)],
                    router_cmd(cfg, "--until-caught-up")):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                  cwd=ROOT, env=env)
            out = proc.stdout + proc.stderr
            assert proc.returncode != 0 and "Traceback" not in out, out
            assert "routes[0].transforms[0].salt_" in out, out
            assert (SALT_ENV if "env" in case or case == "unset" else str(path)) in out, out
            assert "s\\xff" not in out and "sx" not in out
        assert pg.one("select count(*) from pg_replication_slots where slot_name = %s",
                      name) == 0
    finally:
        drop_made(pg, name, if_exists=False)
