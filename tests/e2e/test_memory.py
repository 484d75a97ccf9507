"""A transaction far larger than ``memory_limit`` goes through ``pgrouter run`` in bounded
memory with either Kafka client: the peak resident set of the router grows by much less
than the transaction's records would take if any stage held them all (the spill file is read
back a frame at a time, buffered changes are counted at what they cost, the producers'
queues are bounded). ``bench/memory.py`` measures the same for 2,000,000 rows (README)."""

from __future__ import annotations

import sys

import pytest

from tests.e2e.sources import new_table, source_config, table_route
from tests.helpers import drop_source, peak_rss, router_cmd

pytestmark = pytest.mark.services
ROWS = 300_000
MEMORY_LIMIT = 8 * 1024 * 1024
MIB = 1024 * 1024
#: 300k records of this table are ~330 bytes of key and value each (~95 MiB as Kafka bytes,
#: well over 130 MiB as Python objects, before any client's copy). librdkafka's own queue may
#: hold 100,000 records / 32 MiB of payload (actors/kafka/librdkafka.py) plus its per-message
#: overhead: measured from a small launcher (tests.helpers.peak_rss) the router grew by 97-106
#: MiB with it, by less than 75 MiB with kafka-python
MAX_GROWTH = {"librdkafka": 130 * MIB, "kafka-python": 75 * MIB}


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_huge_transaction_runs_in_bounded_memory(client, pg_dsn, kafka_bootstrap, tmp_path):
    pg, name = new_table(pg_dsn, "mem", "id bigint primary key, n int")
    topic = f"{name}.public.{name}"
    pg.run(f"create publication {name} for table {name}")
    pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", name)
    cfg = source_config(tmp_path / "router.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'client = "{client}"',
                        source_extra=f'memory_limit = {MEMORY_LIMIT}\nspill_dir = "{tmp_path}"',
                        routes=table_route(name, topic))
    try:
        pg.run(f"insert into {name} select g, g % 1000 from generate_series(1, {ROWS}) g")
        # the same process doing nothing but importing what the router imports
        idle, code, _ = peak_rss([sys.executable, "-c", "import actors.cli.run, "
                                  "actors.runner.supervisor, actors.kafka.librdkafka, "
                                  "actors.kafka.kafka_python"])
        assert code == 0
        rss, code, log = peak_rss(router_cmd(cfg, "--until-caught-up"))
        assert code == 0, log[-3000:]
        assert f"records_acked={ROWS}" in log, log[-2000:]
        growth = rss - idle
        assert growth < MAX_GROWTH[client], (f"{client}: peak RSS {rss / MIB:.0f} MiB, "
                                     f"{growth / MIB:.0f} MiB above an idle process")
    finally:
        drop_source(pg, name, kafka_bootstrap, (topic,))
