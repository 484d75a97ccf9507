"""pgrouter's I/O shells around the pure core in ``router/``, grouped by concern:

* ``pipeline/``  — the streaming actors, in the order data flows: ``slot_reader`` →
  ``decoder`` → ``origin_filter`` → ``router_actor`` → ``sink`` → ``progress``, with the
  ``mailbox`` types they exchange and the ``supervisor`` that wires and restarts them.
* ``kafka/``     — the sink's client contract and its two clients, named after their libraries.
* ``apply/``     — ``pgrouter apply``: topics → another PostgreSQL.
* ``materialize/`` — ``pgrouter materialize``: topics → Delta tables (Spark).
* ``services/``  — what every group shares: logs, the retry loop, SQL, the publication catalog.
* ``devstack/``  — the embedded PostgreSQL + Kafka for tests and the demo.
* ``cli/``       — the ``pgrouter`` command and one module per subcommand.
* ``demo/``      — ``make demo``.
"""
