"""The broker version a kafka-python client learnt, shared by the clients made later.

kafka-python probes the broker's API version when a client starts (≈0.1 s). The checks'
admin client learns it first; consumers made afterwards (snapshot progress, definitions,
status) are given it instead of probing again.
"""

from __future__ import annotations

#: bootstrap servers -> the broker version a client found
_BROKER_VERSIONS: dict[str, tuple] = {}


def remember_api_version(bootstrap_servers, version) -> None:
    """Keep what a client learnt while bootstrapping (kafka-python 3: a tuple)."""
    if isinstance(version, tuple):
        _BROKER_VERSIONS[str(bootstrap_servers)] = version


def known_api_version(bootstrap_servers) -> dict:
    """``{"api_version": …}`` for a kafka-python client when one was learnt, else {}."""
    found = _BROKER_VERSIONS.get(str(bootstrap_servers))
    return {} if found is None else {"api_version": found}
