"""The delivery guarantee as a test can check it, during any fault.

* The oracle is PostgreSQL: a ``test_decoding`` slot created before the load lists every
  committed transaction with its end LSN (what ``confirmed_flush_lsn`` is set to) and the ids
  it inserted.
* ``ConfirmSampler`` reads the router slot's ``confirmed_flush_lsn`` continuously (every
  ~20 ms, reconnecting through server restarts) and stamps each reading with the wall-clock
  time it was taken.
* The test topics are created with ``message.timestamp.type = LogAppendTime``: the broker
  stamps every record with the time it appended it. So "what a consumer held at time t" is
  exactly the records stamped ≤ t, and this stays readable after broker outages, leader
  changes and restarts, when no consumer could have read the topic live.
* The rule (``check_confirmation``): for every reading (t, c), every transaction whose end
  LSN is ≤ c had all its rows in Kafka at t. The reading is stamped after the query
  returned and the broker's stamp is truncated to milliseconds, so the check can only miss
  a violation, never report a false one.
"""

from __future__ import annotations

import bisect
import re
import threading
import time

import psycopg2

from tests.helpers import Pg, read_topic

BATCH = 100
#: topic configs that make the broker's append time readable per record
TOPIC_CONFIGS = {"message.timestamp.type": "LogAppendTime"}
LOG_APPEND_TIME = 1  # ConsumerRecord.timestamp_type


def lsn_int(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def wait_for(check, *, timeout: float, what: str, interval: float = 0.1):
    """Poll ``check`` until it returns something true; fail naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Load(threading.Thread):
    """Inserts ``rows`` rows in transactions of ``batch`` rows, at most ``rate`` transactions a
    second (0: as fast as it can); survives server restarts (a batch whose commit outcome is
    unknown is checked and retried)."""

    def __init__(self, dsn: str, table: str, rows: int, rate: float = 0, batch: int = BATCH):
        super().__init__(daemon=True)
        self.dsn, self.table, self.rows, self.rate = dsn, table, rows, rate
        self.batch = batch
        self.error: BaseException | None = None
        self.done_batches = 0

    def stop(self) -> int:
        """End the load after its current transaction; returns the rows it inserted."""
        self.rows = 0
        self.join(timeout=120)
        assert not self.is_alive(), "the load did not stop"
        assert self.error is None, f"load failed: {self.error!r}"
        return self.done_batches * self.batch

    @property
    def running(self) -> bool:
        return self.is_alive() and self.done_batches * self.batch < self.rows

    def _connect(self):
        deadline = time.monotonic() + 120
        while True:
            try:
                conn = psycopg2.connect(self.dsn, connect_timeout=5)
                conn.autocommit = False
                return conn
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def run(self):
        try:
            conn = self._connect()
            batch = 0
            size = self.batch
            while batch * size < self.rows:
                started = time.monotonic()
                try:
                    with conn.cursor() as cur:
                        cur.execute(f"select count(*) from {self.table} where batch = %s", (batch,))
                        if cur.fetchone()[0] == 0:
                            cur.execute(
                                f"insert into {self.table} (id, batch, payload) select g, %s, "
                                f"repeat(md5(g::text), 8) from generate_series(%s, %s) g",
                                (batch, batch * size, batch * size + size - 1))
                    conn.commit()
                    batch += 1
                    self.done_batches = batch
                except (psycopg2.OperationalError, psycopg2.InterfaceError):
                    try:
                        conn.close()
                    except Exception:
                        pass
                    conn = self._connect()
                if self.rate:
                    time.sleep(max(0.0, 1 / self.rate - (time.monotonic() - started)))
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


class ConfirmSampler(threading.Thread):
    """``samples``: (wall time after the reading, confirmed_flush_lsn) of ``slot``."""

    def __init__(self, dsn: str, slot: str, interval: float = 0.02):
        super().__init__(daemon=True)
        self.dsn, self.slot, self.interval = dsn, slot, interval
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self):
        conn = None
        while not self._halt.is_set():
            try:
                if conn is None:
                    conn = psycopg2.connect(self.dsn, connect_timeout=2)
                    conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("select confirmed_flush_lsn::text from pg_replication_slots "
                                "where slot_name = %s", (self.slot,))
                    row = cur.fetchone()
                now = time.time()
                if row and row[0]:
                    self.samples.append((now, lsn_int(row[0])))
            except psycopg2.Error:  # the server is restarting: sample again once it is back
                try:
                    conn.close()
                except Exception:
                    pass
                conn = None
                time.sleep(0.2)
            self._halt.wait(self.interval)
        if conn is not None:
            conn.close()

    def stop(self) -> list[tuple[float, int]]:
        self._halt.set()
        self.join(timeout=30)
        return self.samples

    def between(self, start: float, end: float) -> list[tuple[float, int]]:
        return [s for s in self.samples if start <= s[0] <= end]


def oracle_transactions(pg: Pg, slot: str, table: str | None = None
                        ) -> list[tuple[int, set[int]]]:
    """(end LSN, ids inserted) of every committed transaction, from test_decoding, in commit
    order. The SQL interface reports a COMMIT at the end of its record: the position
    ``confirmed_flush_lsn`` takes when that transaction is confirmed. With ``table`` only
    that table's rows count (other tests may write to the same database meanwhile)."""
    txns, ids = [], set()
    prefix = f"table public.{table}:" if table else "table "
    for lsn, data in pg.run("select lsn::text, data from pg_logical_slot_peek_changes(%s, null, null)",
                            slot):
        if data.startswith("BEGIN"):
            ids = set()
        elif data.startswith(prefix):
            m = re.search(r"id\[bigint\]:(\d+)", data)
            if m:
                ids.add(int(m.group(1)))
        elif data.startswith("COMMIT"):
            txns.append((lsn_int(lsn), ids))
    return txns


def first_appended(records: list[dict]) -> dict[int, int]:
    """id -> the broker's append time (ms) of its first copy."""
    first: dict[int, int] = {}
    for r in records:
        assert r["timestamp_type"] == LOG_APPEND_TIME, "the topic must use LogAppendTime"
        rid = r["key"]["id"]
        if rid not in first or r["timestamp"] < first[rid]:
            first[rid] = r["timestamp"]
    return first


def check_confirmation(samples, txns, records) -> int:
    """Fails if a reading confirmed a transaction whose rows Kafka did not hold at that time;
    returns how many readings were checked against a transaction."""
    first = first_appended(records)
    ends, ready = [], []  # per transaction in LSN order: by when all it and before were in
    latest = 0.0
    for end, ids in sorted(txns, key=lambda t: t[0]):
        for i in ids:
            latest = max(latest, first.get(i, float("inf")))
        ends.append(end)
        ready.append(latest)
    checked, bad = 0, []
    for when, confirmed in samples:
        idx = bisect.bisect_right(ends, confirmed) - 1
        if idx < 0:
            continue
        checked += 1
        if ready[idx] > when * 1000:
            bad.append((when, confirmed, idx))
    if bad:
        lines = []
        for when, confirmed, idx in (bad[0], bad[-1]):
            late = [t for t in range(idx + 1) if any(first.get(i, float("inf")) > when * 1000
                                                     for i in txns[t][1])]
            ids = sorted(txns[late[-1]][1])[:3]
            lines.append(f"confirmed_flush_lsn {confirmed:X} read at {when:.3f} confirmed "
                         f"{len(late)} transactions whose rows were not yet in Kafka (e.g. "
                         f"ids {ids}, first appended at {first.get(ids[0], 'never')})")
        raise AssertionError(f"{len(bad)} of {checked} readings confirmed past Kafka; first "
                             f"and last:\n" + "\n".join(lines))
    return checked


def duplicates(records: list[dict]) -> int:
    """Copies beyond the first of a position; fails if two copies differ in any byte."""
    seen: dict = {}
    dups = 0
    for r in records:
        src = r["value"]["source"]
        pos = (src["commit_lsn"], src["seq"])
        if pos in seen:
            dups += 1
            assert seen[pos] == r["raw"], f"two different records at {pos}"
        else:
            seen[pos] = r["raw"]
    return dups


def max_stall(records: list[dict], start: float, end: float) -> float:
    """Longest gap (s) between consecutive broker append times within [start, end]."""
    stamps = sorted({r["timestamp"] for r in records if start * 1000 <= r["timestamp"] <= end * 1000})
    return max((b - a for a, b in zip(stamps, stamps[1:])), default=0) / 1000


def topic_size(bootstrap: str, topic: str) -> int:
    """Records in ``topic`` (sum of its partitions' end offsets); 0 while Kafka is away."""
    from kafka import KafkaConsumer, TopicPartition

    try:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    except Exception:
        return 0
    try:
        parts = consumer.partitions_for_topic(topic) or ()
        tps = [TopicPartition(topic, p) for p in parts]
        return sum(consumer.end_offsets(tps).values()) if tps else 0
    except Exception:
        return 0
    finally:
        consumer.close()


def verify(pg: Pg, bootstrap: str, table: str, oracle_slot: str, samples, *,
           rows: int) -> dict:
    """The end of every fault test: the topic holds every committed row (nothing lost),
    copies are byte-identical, and no reading confirmed past Kafka. Returns figures."""
    records = read_topic(bootstrap, table, timeout=180)
    ids = {r["key"]["id"] for r in records}
    table_ids = {r[0] for r in pg.run(f"select id from {table}")}
    assert len(table_ids) == rows
    txns = oracle_transactions(pg, oracle_slot, table)
    assert set().union(*(t[1] for t in txns)) == table_ids
    checked = check_confirmation(samples, txns, records)
    assert table_ids - ids == set(), f"{len(table_ids - ids)} committed rows missing in Kafka"
    assert ids - table_ids == set()
    dups = duplicates(records)
    return {"records": len(records), "duplicates": dups, "checked": checked,
            "samples": len(samples), "all": records}


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Drop test topics (those that exist)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        present = set(admin.list_topics())
        if any(t in present for t in topics):
            admin.delete_topics([t for t in topics if t in present])
    finally:
        admin.close()
