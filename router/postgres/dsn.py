"""PostgreSQL connection strings in both of libpq's forms, read once at config load.

libpq accepts a URI (``postgresql://user:secret@host:5432/db?sslmode=require``) or a
``key=value`` list (``host=db.example port=5432 dbname=app password='a b\\'c'``); psycopg2
(the walsender stream) hands either to libpq, asyncpg (every other query) reads only URIs.
Rules kept here, after libpq's ``conninfo_parse`` / ``conninfo_uri_parse``:

* ``key=value``: whitespace around ``=`` is allowed; a value is either single-quoted (``\\'``
  and ``\\\\`` escape inside) or runs to the next whitespace (a backslash escapes the next
  character there too); an unknown keyword, a missing ``=`` or an unterminated quote is an
  error (libpq refuses them too).
* URI: scheme ``postgresql`` or ``postgres``; user, password, hosts, database and query
  values are percent-decoded; hosts are a comma-separated list, IPv6 in brackets; query keys
  are libpq keywords (``ssl=true`` means ``sslmode=require``).
* For asyncpg both forms become one URI carrying every value in its query string. Keywords
  asyncpg has no counterpart for are dropped when they only tune libpq's client side
  (``connect_timeout``, ``keepalives*``…) and refused when dropping them would change who
  or what is trusted (``hostaddr``, ``require_auth``, ``channel_binding=require``…).
* Passwords never leave through ``mask``.
"""

from __future__ import annotations

import re
import urllib.parse

from ..errors import ConfigError

#: every keyword libpq (PostgreSQL 17) knows
LIBPQ_KEYWORDS = frozenset("""
service servicefile user password passfile channel_binding connect_timeout dbname host hostaddr
port client_encoding options application_name fallback_application_name keepalives
keepalives_idle keepalives_interval keepalives_count tcp_user_timeout sslmode sslnegotiation
sslcompression sslcert sslkey sslcertmode sslpassword sslrootcert sslcrl sslcrldir sslsni
requirepeer require_auth ssl_min_protocol_version ssl_max_protocol_version gssencmode
krbsrvname gsslib gssdelegation replication target_session_attrs load_balance_hosts
""".split())

#: what asyncpg reads from a URI itself (``options`` and ``application_name`` travel as
#: startup parameters, which is what libpq does with them too)
_ASYNCPG = frozenset("""
host port dbname user password passfile sslmode sslnegotiation sslcert sslkey sslrootcert
sslcrl sslpassword ssl_min_protocol_version ssl_max_protocol_version target_session_attrs
krbsrvname gsslib service options application_name
""".split())

#: libpq-side tuning with no asyncpg counterpart; leaving it out changes no guarantee
_CLIENT_TUNING = frozenset("""
connect_timeout keepalives keepalives_idle keepalives_interval keepalives_count
tcp_user_timeout fallback_application_name client_encoding sslsni sslcompression
load_balance_hosts
""".split())

#: keyword -> values that ask for nothing asyncpg does not do anyway
_HARMLESS_VALUES = {"gssencmode": {"disable", "prefer"}, "channel_binding": {"disable", "prefer"}}


def is_uri(dsn: str) -> bool:
    return dsn.startswith(("postgresql://", "postgres://"))


def parse(dsn: str, *, path: str = "source.dsn") -> dict[str, str]:
    """Either form → ``{keyword: value}``; a ``ConfigError`` at ``path`` when libpq would
    refuse it."""
    return _parse_uri(dsn, path) if is_uri(dsn) else _parse_pairs(dsn, path)


def _error(path: str, message: str) -> ConfigError:
    return ConfigError(f"invalid connection string: {message}", path=path)


def _parse_pairs(dsn: str, path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    i, n = 0, len(dsn)
    while True:
        while i < n and dsn[i].isspace():
            i += 1
        if i >= n:
            return out
        start = i
        while i < n and dsn[i] != "=" and not dsn[i].isspace():
            i += 1
        key = dsn[start:i]
        while i < n and dsn[i].isspace():
            i += 1
        if i >= n or dsn[i] != "=":
            hint = (" (a URI must start with postgresql:// or postgres://)"
                    if "://" in key else "")
            raise _error(path, f'missing "=" after "{key}"{hint}')
        i += 1
        while i < n and dsn[i].isspace():
            i += 1
        value: list[str] = []
        if i < n and dsn[i] == "'":
            i += 1
            while True:
                if i >= n:
                    raise _error(path, f"unterminated quoted value of {key}")
                c = dsn[i]
                if c == "\\" and i + 1 < n:
                    value.append(dsn[i + 1])
                    i += 2
                elif c == "'":
                    i += 1
                    break
                else:
                    value.append(c)
                    i += 1
        else:
            while i < n and not dsn[i].isspace():
                if dsn[i] == "\\" and i + 1 < n:
                    i += 1
                value.append(dsn[i])
                i += 1
        if key not in LIBPQ_KEYWORDS:
            raise _error(path, f"unknown connection option {key!r}")
        out[key] = "".join(value)


def _parse_uri(dsn: str, path: str) -> dict[str, str]:
    rest = dsn.split("://", 1)[1]
    out: dict[str, str] = {}
    rest, _, query = rest.partition("?")
    netloc, slash, db = rest.partition("/")
    if "@" in netloc:
        auth, _, netloc = netloc.rpartition("@")
        user, colon, password = auth.partition(":")
        if user:
            out["user"] = urllib.parse.unquote(user)
        if colon:
            out["password"] = urllib.parse.unquote(password)
    hosts, ports = [], []
    for spec in netloc.split(",") if netloc else []:
        if spec.startswith("["):
            host, bracket, tail = spec[1:].partition("]")
            if not bracket or (tail and not tail.startswith(":")):
                raise _error(path, f"bad IPv6 host {spec!r}")
            port = tail[1:]
        else:
            host, _, port = spec.partition(":")
        if port and not port.isdigit():
            raise _error(path, f"invalid port {port!r}")
        hosts.append(urllib.parse.unquote(host))
        ports.append(port)
    if any(hosts):
        out["host"] = ",".join(hosts)
    if any(ports):
        out["port"] = ",".join(ports)
    if slash and db:
        out["dbname"] = urllib.parse.unquote(db)
    for item in query.split("&") if query else []:
        key, eq, value = item.partition("=")
        if not eq:
            raise _error(path, f'missing "=" in URI query parameter "{key}"')
        key, value = urllib.parse.unquote(key), urllib.parse.unquote(value)
        if key == "ssl" and value == "true":
            key, value = "sslmode", "require"
        if key not in LIBPQ_KEYWORDS:
            raise _error(path, f"unknown URI query parameter {key!r}")
        out[key] = value
    return out


def validate(dsn: str, *, path: str = "source.dsn") -> None:
    """Refuse, at config load, what neither libpq nor asyncpg would connect with."""
    params = parse(dsn, path=path)
    for key, value in params.items():
        if key == "port":
            for p in value.split(","):
                if p and not (p.isdigit() and 0 < int(p) < 65536):
                    raise _error(path, f"invalid port {p!r}")
        elif key not in _ASYNCPG and key not in _CLIENT_TUNING:
            if value not in _HARMLESS_VALUES.get(key, ()):
                raise _error(path, f"{key}={value} is not supported (pgrouter's SQL "
                                   "connections use asyncpg, which cannot honour it)")


def asyncpg_uri(dsn: str, *, path: str = "source.dsn") -> str:
    """Either form → a URI asyncpg reads exactly as libpq reads ``dsn``."""
    validate(dsn, path=path)
    pairs = []
    for key, value in parse(dsn, path=path).items():
        if key not in _ASYNCPG or value == "":
            continue  # an empty value means libpq's default, which asyncpg applies too
        if key == "host":
            value = ",".join(f"[{h}]" if ":" in h and not h.startswith(("/", "[")) else h
                             for h in value.split(","))
        pairs.append((key, value))
    return "postgresql://?" + urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote,
                                                        safe="") if pairs else "postgresql://"


def describe(dsn: str) -> str:
    """``user@host:port/db`` for messages: where a connection went, never its password."""
    try:
        p = parse(dsn)
    except ConfigError:
        return mask(dsn)
    host = p.get("host") or "(default host)"
    port = f":{p['port']}" if p.get("port") else ""
    user = f"{p['user']}@" if p.get("user") else ""
    return f"{user}{host}{port}/{p.get('dbname') or p.get('user') or '(default database)'}"


_URI_PASSWORD = re.compile(r"(://[^:/@?]*:)[^@]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*")
_PAIR_PASSWORD = re.compile(r"(password\s*=\s*)(?:'(?:\\.|[^'\\])*'?|(?:\\.|[^\s\\])+)")


def mask(dsn: str) -> str:
    """``dsn`` with every password replaced by ``***`` (both forms, quoted values too)."""
    if is_uri(dsn):
        return _QUERY_PASSWORD.sub(r"\1***", _URI_PASSWORD.sub(r"\1***@", dsn))
    return _PAIR_PASSWORD.sub(r"\1***", dsn)
