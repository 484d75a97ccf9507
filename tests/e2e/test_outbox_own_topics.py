"""A breaker's outbox rows whose topic column names a topic that is not an event topic: the
router's state topic, its schema topic, a table route's topic, the route's own dead-letter
topic. Each is a dead letter saying whose topic it is; those topics hold only what the
router wrote (an application with INSERT on the outbox wrote records into them: a forged
state record, a schema record, a change envelope with no source)."""

from __future__ import annotations

import pytest

from tests.e2e.guarantee import delete_topics
from tests.helpers import Pg, read_topic, run_router, unique, write_config

pytestmark = pytest.mark.services


def test_an_event_for_one_of_the_routers_own_topics_is_a_dead_letter(pg_dsn, kafka_bootstrap,
                                                                      tmp_path):
    pg = Pg(pg_dsn)
    name = unique("obxo")
    state, schemas, plain, dead = (f"{name}.state", f"{name}.schemas", f"{name}.plain",
                                   f"{name}.dead")
    pg.run(f"create table {name} (id serial primary key, aggregatetype text, "
           "aggregateid text, payload jsonb)")
    pg.run(f"create table {name}t (id int primary key)")
    pg.run(f"create publication {name} for table {name}, {name}t")
    cfg = write_config(tmp_path / "r.toml", dsn=pg_dsn, slot=name, publications=[name],
                       bootstrap=kafka_bootstrap, kafka_extra=f'schema_topic = "{schemas}"\n',
                       extra=f'[snapshot]\nstate_topic = "{state}"\n',
                       routes=f'[[routes]]\nname = "t{name}"\ntables = ["public.{name}t"]\n'
                              f'topic = "{plain}"\n'
                              f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                              f'[routes.outbox]\ntopic = "{{aggregatetype}}"\n'
                              f'dead_letter = "{dead}"\n')
    try:
        run_router(cfg)
        pg.run(f"insert into {name} (aggregatetype, aggregateid, payload) values "
               f"('{state}', 'k', '{{\"kind\": \"backfill\", \"state\": \"done\"}}'), "
               f"('{schemas}', 'k', '{{\"bogus\": 1}}'), ('{plain}', 'k', '{{\"op\": \"d\"}}'), "
               f"('{dead}', 'k', '{{}}'), ('{name}.ok', 'k', '{{}}')")
        pg.run(f"insert into {name}t values (1)")  # its plan made after the events
        run_router(cfg)
        for topic in (state, schemas, plain):
            keys = [r["key"] for r in read_topic(kafka_bootstrap, topic, decode=False)]
            assert b"k" not in keys, (topic, keys)
        letters = read_topic(kafka_bootstrap, dead, decode=False)
        assert [r["headers"]["id"] for r in letters] == [b"1", b"2", b"3", b"4"]
        whose = [r["headers"]["pgrouter.error"].decode() for r in letters]
        assert "state_topic" in whose[0] and "schema_topic" in whose[1], whose
        assert f"route 't{name}'" in whose[2] and "dead-letter" in whose[3], whose
        ok = read_topic(kafka_bootstrap, f"{name}.ok", decode=False)
        assert [r["headers"]["id"] for r in ok] == [b"5"]
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}, {name}t")
        pg.close()
        delete_topics(kafka_bootstrap, [state, schemas, plain, dead, f"{name}.ok"])
