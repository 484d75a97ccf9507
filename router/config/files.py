"""Config files read: TOML text → a msgspec Struct, every error a ``ConfigError`` naming the
file and the key path (``routes[1].topic``); keys renamed in a release read under their old
name with a warning. Shared by the router's, the applier's and the materializer's files.
"""

from __future__ import annotations

import re
import tomllib

import msgspec

from ..errors import ConfigError

_PATH_RE = re.compile(r"at `\$(.*?)`")


def _path(msg: str) -> str | None:
    m = _PATH_RE.search(msg)
    if not m:
        return None
    return m.group(1).lstrip(".") or None


def decode_toml(text: str, into: type, *, source: str, rename: list[str] | None = None):
    """TOML text → the ``into`` Struct, every error a ``ConfigError`` naming the key path.
    With ``rename`` (a list), old key names are read as their new ones (``RENAMED_KEYS``)
    and a warning for each is appended to it."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", source=source) from exc
    if rename is not None:
        rename.extend(_rename(raw, source=source))
    try:
        return msgspec.convert(raw, into)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        raise ConfigError(_PATH_RE.sub("", msg).strip(" -"), path=_path(msg),
                          source=source) from exc


#: keys renamed, still read under their old names for one release (with a warning):
#: (section, old name) -> new name
RENAMED_KEYS = {("kafka", "progress_topic"): "committed_lsn_topic",
                ("snapshot", "progress_topic"): "state_topic"}


def _rename(raw: dict, *, source: str) -> list[str]:
    """Old key names moved to their new ones in ``raw``; returns a warning line for each."""
    notes = []
    for (section, old), new in RENAMED_KEYS.items():
        table = raw.get(section)
        if not isinstance(table, dict) or old not in table:
            continue
        if new in table:
            raise ConfigError(f"{section}.{new} is set, and also {section}.{old}, its old "
                              "name: keep only the new one", path=f"{section}.{old}",
                              source=source)
        table[new] = table.pop(old)
        notes.append(f"{source}: {section}.{old} is now called {section}.{new}; the old name "
                     "is read for one more release")
    return notes


def read_config_text(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode()
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", source=path) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError("config file is not UTF-8", source=path) from exc
