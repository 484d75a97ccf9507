"""The wiring of ``pgrouter run``: the supervisor that checks the source, builds the
pipeline (``actors.pipeline``) with its snapshot stages (``actors.snapshot``), and keeps it
running: retries, signals, reloads."""
