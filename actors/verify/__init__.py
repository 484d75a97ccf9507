"""``pgrouter verify``: topics against the source at one position (``actors.verify.run``)."""
