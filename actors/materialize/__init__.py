"""The Spark materializer: pgrouter's Kafka topics -> Delta tables.

``job`` is the entry point (``pgrouter materialize``, or ``spark-submit`` with the bundle that
``bundle`` writes); ``settings``, ``columns`` and ``merge`` are its parts; ``config`` validates
its TOML with msgspec for ``pgrouter materialize``. Nothing here imports ``router/``."""
