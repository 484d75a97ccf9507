"""PostgreSQL names as the project puts them into SQL and replication commands.

Rules:

* An identifier (publication, schema, table, column, role) is always double-quoted, a
  double quote inside doubled: the name is taken exactly as the catalog spells it (case,
  spaces, dots, quotes, unicode, reserved words, newlines).
* pgoutput's ``publication_names`` option is one string that the server splits with
  ``SplitIdentifierString`` (comma-separated, unquoted parts are lower-cased and may not
  hold spaces): each name goes in double-quoted, so ``"two words"`` or ``"All Tables"``
  reach the server as written.
* Values (a slot, an origin) go as bound parameters, never into the text.
"""

from __future__ import annotations


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, name: str) -> str:
    """``schema.name``, both quoted."""
    return f"{quote_ident(schema)}.{quote_ident(name)}"


def publication_names(names) -> str:
    """The value of pgoutput's ``publication_names`` option for ``names``."""
    return ",".join(quote_ident(n) for n in names)
