"""router.routing.topics: Kafka's '.'/'_' collision told apart (a twin made since the start is
a restart, one known then a stop) and read from Kafka's own line."""

from router.errors import SinkRejected, SinkUnavailable, is_retryable
from router.routing.topics import collision, twin_named, twin_of


def test_a_twin_made_since_the_start_is_a_restart_and_one_known_then_a_stop():
    made = collision("s.a_b", "s.a.b", frozenset({"other"}))
    assert isinstance(made, SinkUnavailable) and is_retryable(made)
    known = collision("s.a_b", "s.a.b", frozenset({"s.a.b"}))
    assert isinstance(known, SinkRejected) and not is_retryable(known)
    # no start list (no outbox route): a restart would meet it again
    assert isinstance(collision("s.a_b", "s.a.b", None), SinkRejected)
    for err in (made, known):
        assert "'s.a_b'" in str(err) and "'s.a.b'" in str(err)


def test_the_twin_is_read_from_kafkas_line_or_found_among_topics():
    line = ("KafkaError{code=TOPIC_EXCEPTION,val=17,str=\"Topic 'x.a_b' collides with "
            "existing topic: x.a.b\"}")
    assert twin_named(line) == "x.a.b"
    assert twin_named("Broker: Invalid topic") is None
    assert twin_of("x.a_b", ["x.a.b", "y"]) == "x.a.b"
    assert twin_of("x.a_b", ["x.a_b", "X.a.b"]) is None  # itself; case differs: no collision
