"""``pgrouter apply`` from Avro topics (``[kafka] format = "avro"`` on the router,
``[kafka.registry]`` on the applier): the target converges on the source through inserts,
updates (one changing the key, one leaving a TOASTed value unchanged), deletes and a
multi-row transaction, and a restart reads only what is new."""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.test_applier import stopped_line
from tests.e2e.test_multimaster import BIG, Node, rows, sql, until_caught_up

pytestmark = pytest.mark.services


def avro(path, registry_url):
    """The config at ``path`` with the registry (and, for a router, format = "avro")."""
    text = path.read_text()
    extra = "" if "transactions_topic = " in text and "[target]" in text else 'format = "avro"\n'
    head, sep, rest = text.partition("[kafka]\n")
    body, nxt, tail = rest.partition("\n[")
    path.write_text(head + sep + extra + body + f'\n[kafka.registry]\nurl = "{registry_url}"\n'
                    + nxt + tail)
    return path


def test_apply_from_avro_topics_converges(node_db, kafka_bootstrap, registry_url, tmp_path):
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    ra = avro(a.router_config('origin = "none"'), registry_url)
    ab = avro(b.apply_config(a), registry_url)
    assert 'format = "avro"' in ra.read_text() and 'format = "avro"' not in ab.read_text()
    sql(a.dsn, f"insert into t select g, 'v' || g, g, case when g % 10 = 0 then '{BIG}' end "
               "from generate_series(1, 200) g")  # one transaction of 200 rows
    for i in range(201, 221):
        sql(a.dsn, "insert into t values (%s, %s, 0, null)", i, f"one {i}")
    sql(a.dsn, "update t set n = n + 1 where id = 10")  # doc: unchanged TOAST
    sql(a.dsn, "update t set id = 1000, v = 'moved' where id = 20")  # the key changes
    sql(a.dsn, "delete from t where id between 100 and 120")
    until_caught_up("run", ra)
    first = stopped_line(until_caught_up("apply", ab))
    assert rows(a.dsn) == rows(b.dsn)
    assert sql(b.dsn, "select doc = %s from t where id = 10", BIG, fetch=True) == [(True,)]
    assert sql(b.dsn, "select v from t where id = 1000", fetch=True) == [("moved",)]
    assert first["transactions"] == 24
    sql(a.dsn, "update t set id = 2000 where id = 1000")
    sql(a.dsn, "insert into t values (3000, 'late', 1, null)")
    until_caught_up("run", ra)
    second = stopped_line(until_caught_up("apply", ab))
    assert rows(a.dsn) == rows(b.dsn)
    assert second["transactions"] == 2
