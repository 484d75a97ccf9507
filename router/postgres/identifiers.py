"""PostgreSQL names as the project puts them into SQL and replication commands.

Rules:

* An identifier (publication, schema, table, column, role) is always double-quoted, a
  double quote inside doubled: the name is taken exactly as the catalog spells it (case,
  spaces, dots, quotes, unicode, reserved words, newlines).
* pgoutput's ``publication_names`` option is one string that the server splits with
  ``SplitIdentifierString`` (comma-separated, unquoted parts are lower-cased and may not
  hold spaces): each name goes in double-quoted, so ``"two words"`` or ``"All Tables"``
  reach the server as written.
* Values (a slot, an origin) go as bound parameters, never into the text — except in a
  replication command, which takes no parameters: ``START_REPLICATION``'s plugin options
  are single-quoted here (``start_replication``), a single quote inside doubled, the
  command sent in the connection's encoding (UTF-8). psycopg2's own ``start_replication``
  quotes them without a connection, as Latin-1 (a publication named ``ünï`` reached the
  server as ``?n?``, which PostgreSQL 18 skips with a warning: nothing was sent) and with
  ``E''`` for a backslash, which the replication grammar does not know.
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


def start_replication(slot: str, start_lsn: str, options: dict[str, str]) -> str:
    """``START_REPLICATION SLOT … LOGICAL start_lsn (options)``: the slot and the option names
    quoted as identifiers, the option values as single-quoted literals (``start_lsn``: ``X/X``)."""
    opts = ", ".join(f"{quote_ident(k)} '{v.replace(chr(39), chr(39) * 2)}'"
                     for k, v in options.items())
    return (f"START_REPLICATION SLOT {quote_ident(slot)} LOGICAL {start_lsn}"
            + (f" ({opts})" if opts else ""))


def split_qualified(text: str, *, schema_needed: bool = False) -> tuple[str, str]:
    """``schema.table`` as written in a config or on the command line: (schema, table).

    * ``t`` is ``public.t``; ``s.t`` splits at the first dot, each part taken exactly as
      written (``public.dot.ted`` is table ``dot.ted``, ``public.quo"te`` table ``quo"te``).
    * A part that starts with a double quote is a quoted identifier as in SQL (a double quote
      inside doubled, case kept): ``"My Schema.x"."t"``, ``"my.schema".t``, ``"a.b"``
      (``public."a.b"``) — the way to name a schema holding a dot.
    * ``schema_needed``: a lone name is an error, not ``public.name``.

    Raises ``ValueError`` with what is wrong."""
    first, rest = _part(text)
    if not rest:
        if not first or schema_needed:
            raise ValueError(f"table must be written schema.table, got {text!r}")
        return "public", first
    if not rest.startswith(".") or not first:
        raise ValueError(f"table must be written schema.table, got {text!r}")
    rest = rest[1:]
    if rest.startswith('"'):
        table, tail = _part(rest)
        if tail:
            raise ValueError(f"unexpected {tail!r} after the quoted table name in {text!r}")
    else:
        table = rest
    if not table:
        raise ValueError(f"table must be written schema.table, got {text!r}")
    return first, table


def _part(text: str) -> tuple[str, str]:
    """The first name of ``text`` (quoted or up to the first dot) and what follows it."""
    if not text.startswith('"'):
        name, dot, rest = text.partition(".")
        return name, dot + rest
    i, out = 1, []
    while True:
        j = text.find('"', i)
        if j < 0:
            raise ValueError(f"unterminated double quote in {text!r}")
        out.append(text[i:j])
        if text.startswith('""', j):
            out.append('"')
            i = j + 2
            continue
        name = "".join(out)
        if not name:
            raise ValueError(f"empty quoted name in {text!r}")
        return name, text[j + 1:]


def unparse_qualified(schema: str, table: str) -> str:
    """The text ``split_qualified`` reads back as (schema, table): plain when it can be."""
    plain_schema = schema and "." not in schema and not schema.startswith('"')
    plain_table = table and not table.startswith('"')
    return ((schema if plain_schema else quote_ident(schema)) + "."
            + (table if plain_table else quote_ident(table)))
