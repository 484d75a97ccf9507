"""Log sequence numbers: 64-bit WAL positions, written ``X/Y`` in upper-case hex."""

from __future__ import annotations

from ..errors import ConfigError

INVALID_LSN = 0


def format_lsn(lsn: int) -> str:
    """``0x16B3748`` -> ``'0/16B3748'`` (PostgreSQL's ``%X/%X``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """``'0/16B3748'`` -> ``0x16B3748``. Raises ``ValueError`` for anything else."""
    hi, sep, lo = text.strip().partition("/")
    if not sep or not hi or not lo or len(hi) > 8 or len(lo) > 8:
        raise ValueError(f"not an LSN: {text!r}")
    try:
        return (int(hi, 16) << 32) | int(lo, 16)
    except ValueError:
        raise ValueError(f"not an LSN: {text!r}") from None


def parse_lsn_config(text: str, *, path: str) -> int:
    try:
        return parse_lsn(text)
    except ValueError as exc:
        raise ConfigError(str(exc), path=path) from exc
