"""The Spark materializer: pgrouter's Kafka topics -> Delta tables (``job.py`` runs alone under
``spark-submit``; ``config.py`` validates its TOML for ``pgrouter materialize``)."""
