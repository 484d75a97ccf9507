"""Capture golden pgoutput bytes from a real PostgreSQL (15+) into ``golden/*.tsv``.

Usage: ``python tests/router/pgoutput/capture_golden.py postgresql://postgres@127.0.0.1:5499/postgres``

The server needs ``wal_level=logical`` and ``max_prepared_transactions > 0``. Each scenario
creates a fresh slot, runs a workload, and peeks the slot through the SQL interface, writing
exactly what ``psql -At -F $'\\t' -c "select lsn, encode(data,'hex') from
pg_logical_slot_peek_binary_changes(...)"`` prints. Streaming is forced by
``logical_decoding_work_mem = 64kB`` in the peeking session. The golden tests assert on the
values written here (table names, ids, texts), so change both together.
"""

from __future__ import annotations

import pathlib
import sys

import psycopg2

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"

SCHEMA = """
drop publication if exists golden_pub;
drop schema if exists golden cascade;
create schema golden;
create type golden.mood as enum ('sad', 'ok', 'happy');
create table golden.items (
    id int primary key,
    label text not null,
    price numeric(10,2),
    active bool,
    created timestamptz,
    payload bytea,
    ref uuid,
    doc jsonb,
    mood golden.mood,
    tags text[],
    big text
);
alter table golden.items alter column big set storage external;
create table golden.full_ri (id int, note text);
alter table golden.full_ri replica identity full;
create table golden.idx_ri (a int not null, b int not null, v text);
create unique index idx_ri_ab on golden.idx_ri (a, b);
alter table golden.idx_ri replica identity using index idx_ri_ab;
create table golden.parent (id int primary key);
create table golden.child (id int primary key, parent_id int references golden.parent(id));
create table golden.bulk (id int primary key, filler text);
create publication golden_pub for all tables;
"""

BIG = "x" * 10000  # stored out of line (storage external) so later updates send 'u'


def slot(cur, name: str, two_phase: bool = False) -> None:
    cur.execute("select count(*) from pg_replication_slots where slot_name = %s", (name,))
    if cur.fetchone()[0]:
        cur.execute("select pg_drop_replication_slot(%s)", (name,))
    cur.execute("select pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
                (name, two_phase))


def peek(cur, name: str, out: str, options: list[str]) -> None:
    cur.execute("set logical_decoding_work_mem = '64kB'")
    placeholders = ", ".join(["%s"] * len(options))
    cur.execute(f"select lsn, encode(data, 'hex') from pg_logical_slot_peek_binary_changes("
                f"%s, null, null, {placeholders})", [name, *options])
    rows = cur.fetchall()
    (GOLDEN / out).write_text("".join(f"{lsn}\t{hexdata}\n" for lsn, hexdata in rows))
    print(f"{out}: {len(rows)} messages")
    cur.execute("select pg_drop_replication_slot(%s)", (name,))


def connect(dsn: str):
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    return conn


def v1_workload(conn) -> None:
    cur = conn.cursor()
    cur.execute("begin")
    cur.execute("insert into golden.items values (1, 'first', 12.50, true, "
                "'2024-01-02 03:04:05.123456+00', '\\xdeadbeef', "
                "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, 2]}', 'happy', "
                "'{a,b}', %s)", (BIG,))
    cur.execute("insert into golden.items (id, label) values (2, 'second')")
    cur.execute("commit")
    # non-key update of a row with a TOASTed column: new tuple only, big = 'u'
    cur.execute("update golden.items set label = 'first, updated' where id = 1")
    # key update: K part with the old key
    cur.execute("update golden.items set id = 3 where id = 2")
    cur.execute("delete from golden.items where id = 3")
    cur.execute("insert into golden.full_ri values (1, 'one')")
    cur.execute("update golden.full_ri set note = 'uno' where id = 1")  # O part
    cur.execute("delete from golden.full_ri where id = 1")  # O part
    cur.execute("insert into golden.idx_ri values (1, 2, 'v')")
    cur.execute("update golden.idx_ri set b = 3 where a = 1")  # K part: (a, b) only
    cur.execute("delete from golden.idx_ri where a = 1")
    cur.execute("insert into golden.parent values (1)")
    cur.execute("insert into golden.child values (1, 1)")
    cur.execute("truncate golden.parent, golden.child restart identity cascade")
    cur.execute("select pg_logical_emit_message(false, 'golden', 'non-transactional')")
    cur.execute("begin")
    cur.execute("select pg_logical_emit_message(true, 'golden', '\\x00ff'::bytea)")
    cur.execute("insert into golden.items (id, label) values (10, 'before alter')")
    cur.execute("alter table golden.items add column extra int")
    cur.execute("insert into golden.items (id, label, extra) values (11, 'after alter', 7)")
    cur.execute("commit")
    # a transaction replayed from another node: Origin message after Begin
    cur.execute("select pg_replication_origin_create('golden_node')")
    cur.execute("select pg_replication_origin_session_setup('golden_node')")
    cur.execute("begin")
    cur.execute("select pg_replication_origin_xact_setup('0/ABCDEF', "
                "'2024-05-06 07:08:09.000001+00')")
    cur.execute("insert into golden.items (id, label) values (20, 'from golden_node')")
    cur.execute("commit")
    cur.execute("select pg_replication_origin_session_reset()")
    cur.execute("select pg_replication_origin_drop('golden_node')")
    cur.execute("alter table golden.items drop column extra")


def v2_workload(dsn: str) -> None:
    a, b = connect(dsn), connect(dsn)
    ca, cb = a.cursor(), b.cursor()
    filler = "f" * 200
    # Two large transactions interleaved: each is streamed in several blocks.
    ca.execute("begin")
    cb.execute("begin")
    for step in range(4):
        ca.execute("insert into golden.bulk select g, %s from generate_series(%s, %s) g",
                   (filler, 1000 * step + 1, 1000 * step + 400))
        cb.execute("insert into golden.bulk select g, %s from generate_series(%s, %s) g",
                   (filler, 100000 + 1000 * step + 1, 100000 + 1000 * step + 400))
    # a rolled back subtransaction inside the streamed transaction A
    ca.execute("savepoint s1")
    ca.execute("insert into golden.bulk select g, 'rolled back' from generate_series(50001, 50400) g")
    ca.execute("rollback to savepoint s1")
    ca.execute("insert into golden.bulk values (60000, 'after savepoint')")
    ca.execute("commit")
    cb.execute("rollback")  # streamed, then aborted as a whole
    ca.execute("insert into golden.bulk values (70000, 'small after stream')")
    ca.execute("select pg_logical_emit_message(true, 'golden', 'streamed message')")
    a.close()
    b.close()


def v3_workload(conn) -> None:
    cur = conn.cursor()
    cur.execute("begin")
    cur.execute("insert into golden.items (id, label) values (100, 'prepared then committed')")
    cur.execute("prepare transaction 'golden_commit'")
    cur.execute("commit prepared 'golden_commit'")
    cur.execute("begin")
    cur.execute("insert into golden.items (id, label) values (101, 'prepared then rolled back')")
    cur.execute("prepare transaction 'golden_rollback'")
    cur.execute("rollback prepared 'golden_rollback'")
    cur.execute("begin")
    cur.execute("insert into golden.bulk select g, repeat('p', 200) from "
                "generate_series(200001, 201000) g")
    cur.execute("prepare transaction 'golden_streamed'")
    cur.execute("commit prepared 'golden_streamed'")


def main(dsn: str) -> None:
    GOLDEN.mkdir(exist_ok=True)
    conn = connect(dsn)
    cur = conn.cursor()
    cur.execute(SCHEMA)

    slot(cur, "golden_v1")
    v1_workload(connect(dsn))
    base = ["publication_names", "golden_pub", "messages", "true"]
    # peeking does not consume, so the same slot gives the text and the binary capture
    cur.execute("set logical_decoding_work_mem = '64kB'")
    for out, extra in (("v1_text.tsv", []), ("v1_binary.tsv", ["binary", "true"])):
        options = ["proto_version", "1", *base, *extra]
        placeholders = ", ".join(["%s"] * len(options))
        cur.execute(f"select lsn, encode(data, 'hex') from pg_logical_slot_peek_binary_changes("
                    f"'golden_v1', null, null, {placeholders})", options)
        rows = cur.fetchall()
        (GOLDEN / out).write_text("".join(f"{lsn}\t{h}\n" for lsn, h in rows))
        print(f"{out}: {len(rows)} messages")
    cur.execute("select pg_drop_replication_slot('golden_v1')")

    cur.execute("truncate golden.bulk")
    slot(cur, "golden_v2")
    v2_workload(dsn)
    peek(cur, "golden_v2", "v2_stream.tsv",
         ["proto_version", "2", *base, "streaming", "true"])

    cur.execute("truncate golden.bulk")
    slot(cur, "golden_v3", two_phase=True)
    v3_workload(connect(dsn))
    peek(cur, "golden_v3", "v3_twophase.tsv",
         ["proto_version", "3", *base, "streaming", "true", "two_phase", "true"])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
