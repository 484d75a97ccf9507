"""``pgrouter apply``: the router's topics applied to another PostgreSQL (``applier``), read
by ``actors.kafka.consumers``."""
