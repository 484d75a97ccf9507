"""Which chunks of an initial snapshot Kafka holds, from the pipeline sink's tickets.

Rules:

* The sink registers a ticket per batch it hands to Kafka (``Registered``) and reports it
  acknowledged (``Acked``, with its records); tickets are consecutive and cover
  consecutive chunks, and several chunks may share one.
* A chunk is durable once every ticket up to the one holding it is acknowledged: the
  records of that prefix of tickets reach past the chunk's last record. A ticket
  acknowledged after a gap waits for the gap.
* A chunk whose send raised delivered nothing: it is taken back (``unsent``).
* The same prefix rule makes the stream's confirmed position (``router.delivery.confirmation``);
  why the initial snapshot reads it here rather than through that position is said once,
  in ``actors.runner.coordinator``.
"""

from __future__ import annotations


class AckedPrefix:
    """Which snapshot chunks Kafka holds, from the sink's tickets. The sink may put several
    consecutive chunks under one ticket (tickets are consecutive and cover consecutive
    chunks), so a chunk is durable once every ticket up to the one holding it is: the
    records of that prefix of tickets reach past the chunk's last record."""

    def __init__(self):
        self.entries: list[list] = []  # [(table, range), records] per chunk, in the sink's order
        self.first = 0                 # entries before it are known durable
        self.through = 0               # records of those entries
        self.durable_records = 0       # records of the acknowledged prefix of tickets
        self.next_ticket: int | None = None
        self.out_of_order: dict[int, int] = {}  # acknowledged after a gap: ticket -> records
        self.all_sent = False

    def sending(self, key: tuple, records: int) -> list:
        entry = [key, records]
        self.entries.append(entry)
        return entry

    def unsent(self, entry: list) -> None:
        for i in range(len(self.entries) - 1, self.first - 1, -1):
            if self.entries[i] is entry:
                del self.entries[i]
                return

    def registered(self, ticket: int) -> None:
        if self.next_ticket is None:
            self.next_ticket = ticket

    def done(self, ticket: int, records: int) -> list[tuple]:
        """A ticket acknowledged: the (table, range) of the chunks now known durable (one
        per chunk)."""
        self.out_of_order[ticket] = records
        while self.next_ticket in self.out_of_order:
            self.durable_records += self.out_of_order.pop(self.next_ticket)
            self.next_ticket += 1
        names = []
        entries = self.entries
        while self.first < len(entries) and (
                self.through + entries[self.first][1] <= self.durable_records):
            self.through += entries[self.first][1]
            names.append(entries[self.first][0])
            self.first += 1
        return names

    def all_durable(self) -> bool:
        return self.all_sent and self.first == len(self.entries) and not self.out_of_order
