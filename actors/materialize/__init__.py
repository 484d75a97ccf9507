"""The Spark materializer: pgrouter's Kafka topics -> Delta tables.

``job`` is the entry point (``pgrouter materialize``, or ``spark-submit`` with the bundle that
``bundle`` writes); ``settings``, ``columns``, ``avro`` and ``merge`` are its parts; ``config``
validates its TOML with msgspec for ``pgrouter materialize``. Of ``router/`` the job imports only
the array parser and (for Avro topics, with the registry client) the error tree."""
