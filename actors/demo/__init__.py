"""``make demo`` (``python -m actors.demo``): the dev stack, the shop schema and its
publications streamed by the router (``shop``), and the topics as Delta tables (``spark_tables``)."""
