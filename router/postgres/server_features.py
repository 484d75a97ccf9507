"""What a PostgreSQL server offers logical replication, by ``server_version_num``.

Rules: detected from the server the router connects to (never configured), used where the
router can take advantage of it, and named in a message where a configuration asks for
something the server lacks. The README's support table lists the same facts.
"""

from __future__ import annotations

import msgspec

#: feature -> first ``server_version_num`` that has it
SINCE = {
    "pgoutput protocol 2 (streaming in-progress transactions)": 140000,
    "pgoutput protocol 3 (two-phase)": 150000,
    "row filters and column lists": 150000,
    "pgoutput protocol 4 (streaming = parallel)": 160000,
    "origin option (the server drops replicated changes)": 160000,
    "logical decoding on a standby": 160000,
    "failover slots (synchronised to a standby)": 170000,
    "published generated columns": 180000,
}


class ServerFeatures(msgspec.Struct, frozen=True):
    version: int  # server_version_num

    @property
    def major(self) -> int:
        return self.version // 10000

    @property
    def max_proto_version(self) -> int:
        return 4 if self.version >= 160000 else 3 if self.version >= 150000 else (
            2 if self.version >= 140000 else 1)

    @property
    def origin_option(self) -> bool:
        return self.version >= 160000

    @property
    def standby_decoding(self) -> bool:
        return self.version >= 160000

    @property
    def failover_slots(self) -> bool:
        return self.version >= 170000

    @property
    def generated_columns(self) -> bool:
        return self.version >= 180000

    def lacks(self, feature: str) -> str:
        """One line for a configuration asking for ``feature`` (a ``SINCE`` key) here."""
        return (f"PostgreSQL {self.major} has no {feature}; it needs PostgreSQL "
                f"{SINCE[feature] // 10000} or later")
