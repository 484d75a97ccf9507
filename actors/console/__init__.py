"""The operator console: the status board the actors publish to, the page and its JSON
(``/api/status``) served from the metrics listener's thread, and the overview of several
routers (``pgrouter console``). Nothing here awaits the trio loop: the HTTP thread reads what
the actors have published."""
