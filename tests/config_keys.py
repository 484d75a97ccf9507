"""Every key of pgrouter's three config files, read from the msgspec Structs that decode them
(the TOML names, nested sections as ``section.key``; a list of tables such as ``[[routes]]``
as ``routes.key``). The configuration reference (docs/configuration.md) is held against it."""

from __future__ import annotations

import typing

import msgspec

from actors.materialize.config import MaterializeConfig
from router.config.applier import ApplyConfig
from router.config.router import Config

#: file → its root Struct
FILES = {"router": Config, "apply": ApplyConfig, "materialize": MaterializeConfig}


def _structs(tp) -> list[type]:
    """The Struct types inside an annotation (Optional, unions, lists, Annotated)."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return [tp]
    out = []
    for arg in typing.get_args(tp):
        out += _structs(arg)
    return out


def keys(root: type, prefix: str = "") -> dict[str, msgspec.structs.FieldInfo]:
    out = {}
    hints = typing.get_type_hints(root, include_extras=True)
    for f in msgspec.structs.fields(root):
        name = f"{prefix}{f.encode_name}"
        nested = _structs(hints[f.name])
        out[name] = f
        for sub in nested:
            out.update(keys(sub, name + "."))
    return out


def all_keys() -> dict[str, dict[str, msgspec.structs.FieldInfo]]:
    return {file: keys(root) for file, root in FILES.items()}
