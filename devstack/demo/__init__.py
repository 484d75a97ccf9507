"""``make demo`` (``python -m devstack.demo``): the dev stack, the shop schema and its
publications streamed by the router (``shop``), and the topics as Delta tables (``spark_tables``)."""
