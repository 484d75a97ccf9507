"""The flush-LSN rule: only end LSNs of durable transactions, in commit order."""

from router.delivery.confirmation import ConfirmationTracker


def test_confirms_a_transaction_once_done():
    p = ConfirmationTracker()
    p.begin("t", 100)
    assert p.confirmed == 0
    p.done("t")
    assert p.confirmed == 100


def test_later_transaction_waits_for_earlier_one():
    p = ConfirmationTracker()
    p.begin("a", 100)
    p.begin("b", 200)
    p.done("b")
    assert p.confirmed == 0, "b is durable but a is not: nothing may be confirmed"
    p.done("a")
    assert p.confirmed == 200


def test_keepalive_waits_for_in_flight_and_confirms_when_idle():
    p = ConfirmationTracker()
    p.begin(1, 100)
    p.keepalive(500)
    assert p.confirmed == 0
    p.done(1)
    assert p.confirmed == 500
    p.keepalive(600)
    assert p.confirmed == 600
    assert p.in_flight == 0


def test_transaction_after_keepalive_does_not_block_it():
    p = ConfirmationTracker()
    p.keepalive(50)
    p.begin(1, 100)
    assert p.confirmed == 50
    p.done(1)
    assert p.confirmed == 100


def test_hold_caps_confirmation_and_never_moves_back():
    p = ConfirmationTracker(start_lsn=50)
    p.set_hold(120)
    p.begin(1, 200)
    p.done(1)
    assert p.confirmed == 120
    p.set_hold(10)
    p.keepalive(300)
    assert p.confirmed == 120, "never backwards"
    p.set_hold(None)
    p.keepalive(300)
    assert p.confirmed == 300


def test_delivered_passes_a_hold_that_confirmation_respects():
    p = ConfirmationTracker(start_lsn=50)
    p.set_hold(120)  # a prepared transaction at 121, held until COMMIT PREPARED
    p.begin(1, 200)
    p.keepalive(250)
    assert p.delivered == 50, "the transaction at 200 is not durable yet"
    p.done(1)
    assert (p.confirmed, p.delivered) == (120, 250)
    p.set_hold(None)  # committed: its transaction is registered before the hold is lifted
    p.begin(2, 300)
    assert p.confirmed == 120, "nothing confirmed past the prepare before it is delivered"
    p.done(2)
    assert (p.confirmed, p.delivered) == (300, 300)


def test_confirmed_never_moves_backwards_on_an_older_keepalive():
    p = ConfirmationTracker()
    p.begin(1, 500)
    p.done(1)
    p.keepalive(400)
    assert p.confirmed == 500
