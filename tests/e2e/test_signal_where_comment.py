"""A breaker's signal whose ``where`` ends with an SQL line comment (``id > 50 -- the last
ten``): PostgreSQL and the row-filter check take it, and the backfill reads the rows it
matches in chunks of 4 (the keyset condition and ORDER BY after it). It failed at once with
"syntax error at end of input": the comment swallowed the rest of the chunk's query."""

from __future__ import annotations

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.test_signals import SIGNAL, setup, signal_states, snapshot_ids, teardown
from tests.helpers import run_router, unique

pytestmark = pytest.mark.services


def test_a_where_ending_in_a_line_comment_backfills_its_rows(pg_dsn, kafka_bootstrap, tmp_path):
    name = unique("sigc")
    pg, cfg = setup(pg_dsn, kafka_bootstrap, tmp_path, name)
    with open(cfg, "a") as config:  # [snapshot] is the config's last table
        config.write("chunk_rows = 4\n")
    try:
        run_router(cfg)  # the slot, no snapshot
        pg.run(SIGNAL, name, f"public.{name}", name, "id > 50 -- the last ten")
        done = run_router(cfg)
        assert snapshot_ids(kafka_bootstrap, name) == list(range(51, 61)), done.stderr[-3000:]
        assert [s for s, _ in signal_states(kafka_bootstrap, name).values()] == ["accepted"]
    finally:
        teardown(pg, name)
        delete_topics(kafka_bootstrap, [name])
