"""Sorting more entries than fit a memory budget: sorted runs spilled to temporary files.

:class:`SpillingSorter` keeps entries in memory until their payloads reach
``budget_bytes``, then sorts them and writes them to an unnamed temporary file as one
sorted run; :meth:`SpillingSorter.sorted` merges the runs (``heapq.merge``), reading
each back :data:`CHUNK_BYTES` at a time. Memory is therefore bounded by the budget
plus one 64-KiB chunk per spilled run (``tail / budget`` runs: 2.5 MiB for a 10-GiB
tail with the default 256-MiB budget); below the budget nothing touches the disk and
the cost is one in-memory sort, as before.
"""

from __future__ import annotations

import heapq
import marshal
import tempfile
from collections.abc import Iterator
from typing import IO

#: (sequence number, index in its change set, key group, payload): sorts in read order.
Entry = tuple[int, int, int, bytes]

#: Payload bytes held in memory before the entries are spilled as a sorted run (default).
BUDGET_BYTES = 256 * 1024 * 1024
#: Payload bytes of a spilled run read back at once (the merge holds one per run).
CHUNK_BYTES = 64 * 1024
#: Counted per entry on top of its payload (tuple and ints), so tiny payloads spill too.
ENTRY_OVERHEAD = 100


class SpillingSorter:
    """Collects entries; yields them sorted with memory bounded by ``budget_bytes``.

    Invariant: at most ``budget_bytes`` of (payload + :data:`ENTRY_OVERHEAD` per
    entry) plus one :meth:`extend` call's entries are held in memory at once while
    adding, and while merging one chunk of :data:`CHUNK_BYTES` per spilled run besides.
    Not thread-safe; use once.
    """

    def __init__(self, budget_bytes: int = BUDGET_BYTES, directory: str | None = None) -> None:
        self._budget = max(1, budget_bytes)
        self._directory = directory
        self._entries: list[Entry] = []
        self._held = 0
        self._runs: list[IO[bytes]] = []
        #: Most bytes held in memory at once (payload + overhead), for tests.
        self.peak_held_bytes = 0

    @property
    def spilled_runs(self) -> int:
        """How many sorted runs went to disk."""
        return len(self._runs)

    def extend(self, entries: list[Entry], payload_bytes: int) -> None:
        """Keep ``entries`` (``payload_bytes`` of payload, an upper bound is fine);
        spill a sorted run once the budget is full (per call: one record's worth)."""
        self._entries.extend(entries)
        self._held += payload_bytes + len(entries) * ENTRY_OVERHEAD
        if self._held >= self._budget:
            self.peak_held_bytes = max(self.peak_held_bytes, self._held)
            self._spill()

    def sorted(self) -> Iterator[Entry]:
        """Every entry added, in order (equal ones adjacent); closes the spilled runs."""
        self.peak_held_bytes = max(self.peak_held_bytes, self._held)
        self._entries.sort()
        try:
            if not self._runs:
                yield from self._entries
                return
            yield from heapq.merge(*(_read_run(run) for run in self._runs), self._entries)
        finally:
            self.close()

    def close(self) -> None:
        """Drop what is held and delete the spilled runs."""
        self._entries = []
        self._held = 0
        for run in self._runs:
            run.close()
        self._runs = []

    def _spill(self) -> None:
        self._entries.sort()
        # Closed by close() (or sorted()): it lives as long as the sorter, not a block.
        run = tempfile.TemporaryFile(  # noqa: SIM115
            prefix="kafka-changelog-run-", dir=self._directory)
        chunk: list[Entry] = []
        size = 0
        for entry in self._entries:
            chunk.append(entry)
            size += len(entry[3]) + ENTRY_OVERHEAD
            if size >= CHUNK_BYTES:
                _write_chunk(run, chunk)
                chunk, size = [], 0
        if chunk:
            _write_chunk(run, chunk)
        run.seek(0)
        self._runs.append(run)
        self._entries = []
        self._held = 0


def _write_chunk(run: IO[bytes], chunk: list[Entry]) -> None:
    # Length-prefixed: marshal.load() on a file reads it in tiny pieces, ~20x slower.
    blob = marshal.dumps(chunk)
    run.write(len(blob).to_bytes(8, "big"))
    run.write(blob)


def _read_run(run: IO[bytes]) -> Iterator[Entry]:
    while header := run.read(8):
        chunk: list[Entry] = marshal.loads(run.read(int.from_bytes(header, "big")))
        yield from chunk
