"""pgrouter's I/O shells around the pure core in ``router/``, grouped by concern:

* ``runner/``    — ``pgrouter run``'s wiring: the ``supervisor`` (stages, retries, signals,
  reload) and the ``source`` preflight (find or create the slot, every check once).
* ``snapshot/``  — initial snapshots and backfills: sources feeding the pipeline's sink.
* ``pipeline/``  — the streaming actors, in the order data flows: ``slot_reader`` →
  ``decoder`` → ``origin_filter`` → ``router_actor`` → ``sink`` → ``confirmer``, with the
  ``mailbox`` types they exchange.
* ``kafka/``     — the Kafka adapters: their Protocol contracts, two clients named after their
  libraries, the compacted-topic reader, the applier's consumers, the API-version knowledge.
* ``apply/``     — ``pgrouter apply``: topics → another PostgreSQL.
* ``materialize/`` — ``pgrouter materialize``: topics → Delta tables (Spark).
* ``services/``  — what every group shares: logs, the retry loop, SQL, the publication catalog.
* ``cli/``       — the ``pgrouter`` command and one module per subcommand.

The dev stack and ``make demo`` are not here: ``devstack/`` beside this package (not installed).
"""
