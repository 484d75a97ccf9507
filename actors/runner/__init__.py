"""``pgrouter run``: the supervisor that checks the source and keeps the pipeline running
(retries, signals, reloads, [ha]), the pipeline as ``wiring`` builds it (``actors.pipeline``
with its snapshot stages, ``actors.snapshot``), the source (``source``) and the HTTP
endpoint's status (``status``)."""
