"""Which initial-snapshot chunks Kafka holds, from the sink's tickets (``AckedPrefix``).

The sink puts consecutive whole transactions under one ticket while their registration is not
sent yet, so a ticket may hold several snapshot chunks, of several tables. A table may be
recorded done (and left alone by the backfill that finishes an interrupted snapshot) only
once every record of it is acknowledged."""

from __future__ import annotations

from actors.snapshot.tickets import AckedPrefix


def _sent(prefix: AckedPrefix, chunks: list[tuple[str, int]]) -> list:
    return [prefix.sending(table, n) for table, n in chunks]


def test_a_ticket_holding_several_chunks_makes_each_of_them_durable():
    p = AckedPrefix()
    _sent(p, [("a", 2), ("a", 2), ("b", 3), ("b", 1)])
    p.registered(0)
    # ticket 0 holds the first three chunks (7 records), ticket 1 the last one
    assert p.done(0, 7) == ["a", "a", "b"]
    assert p.done(1, 1) == ["b"]
    p.all_sent = True
    assert p.all_durable()


def test_a_ticket_acknowledged_early_waits_for_the_tickets_before_it():
    """Tickets of other partitions are acknowledged in any order: a later ticket's records
    say nothing of an earlier one's."""
    p = AckedPrefix()
    _sent(p, [("a", 5), ("b", 5)])
    p.registered(0)
    assert p.done(1, 5) == []  # b's chunk: a's ticket is not acknowledged yet
    assert p.done(0, 5) == ["a", "b"]


def test_tickets_need_not_start_at_zero():
    p = AckedPrefix()
    _sent(p, [("a", 1)])
    p.registered(41)
    assert p.done(41, 1) == ["a"]


def test_a_chunk_whose_send_failed_is_not_waited_for():
    p = AckedPrefix()
    first, second, third = _sent(p, [("a", 2), ("a", 2), ("b", 2)])
    p.unsent(third)  # cancelled by the drain before the sink took it
    p.unsent(second)
    p.registered(0)
    assert p.done(0, 2) == ["a"]
    p.all_sent = True
    assert p.all_durable()


def test_nothing_is_durable_before_it_is_acknowledged():
    p = AckedPrefix()
    _sent(p, [("a", 3)])
    p.registered(0)
    p.all_sent = True
    assert not p.all_durable()
    assert p.done(0, 2) == []  # not every record of the chunk (cannot happen; still no)
    assert not p.all_durable()
