"""One key group's stored entries in memory, mutated as the store would be.

A restore into an empty RocksDB store writes each key group of the snapshot as SST
files (:mod:`.rocksdb_ingest`). The changelog tail's ops of that key group are applied
first, to its decoded entries in a dict (stored key -> stored value, the store's own
layout), through :func:`~.rocksdb_mutation.mutate` like every other path: so the ingested
file holds the key group's final state, and the tail costs no store reads (every key
the tail touches would otherwise be a cold point read of an ingested file) and no write
batches.

:class:`GroupWrites` is the :class:`~.rocksdb_mutation.StoreWrites` of such a dict. The
map queries (is a map empty, its entries) need the entries under a map's prefix: the
dict's keys are sorted once, at the first such query, and the map entries the ops add
afterwards are kept by map.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence


class GroupWrites:
    """:class:`~.rocksdb_mutation.StoreWrites` over ``entries`` (stored key -> value of
    one key group; mutated in place). Change marks go to :attr:`marks` when ``mark`` is
    set (the caller writes them to the store).

    Invariant: once the sorted ``_index`` of the keys exists, every stored key of a map
    entry in ``entries`` is in it or in ``_added`` under its map's prefix (a key may be in
    both: readers skip keys no longer in ``entries`` and tolerate repeats).
    """

    def __init__(self, entries: dict[bytes, bytes], mark: bytes | None) -> None:
        self.entries = entries
        self.mark = mark
        #: Change-mark keys written, in order.
        self.marks: list[bytes] = []
        self._index: list[bytes] | None = None
        self._added: dict[bytes, set[bytes]] = {}

    def settle(self, key: bytes, new: bytes | None, start: bytes | None = None) -> int:
        entries = self.entries
        existed = key in entries
        if new is not None:
            if start is not None and not existed and self._index is not None:
                self._added.setdefault(start, set()).add(key)
            entries[key] = new
            return 0 if existed else 1
        if existed:
            del entries[key]
            return -1
        return 0

    def stored(self, key: bytes) -> bytes | None:
        return self.entries.get(key)

    def map_entries(self, start: bytes) -> list[bytes]:
        return sorted(set(self._under(start)))

    def delete(self, keys: Sequence[bytes], start: bytes | None = None) -> None:
        entries = self.entries
        for key in keys:
            entries.pop(key, None)

    def put_mark(self, key: bytes) -> None:
        self.marks.append(key)

    def _under(self, start: bytes) -> Iterator[bytes]:
        """The stored keys present under ``start`` (a map's prefix)."""
        entries = self.entries
        index = self._index
        if index is None:
            index = self._index = sorted(entries)
        position = bisect_left(index, start)
        while position < len(index) and index[position].startswith(start):
            if index[position] in entries:
                yield index[position]
            position += 1
        for key in self._added.get(start, ()):
            if key in entries:
                yield key


__all__ = ["GroupWrites"]
