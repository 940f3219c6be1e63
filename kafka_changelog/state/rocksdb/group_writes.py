"""One key group's stored entries in memory, mutated as the store would be.

A restore into an empty RocksDB store writes each key group of the snapshot as SST
files (:mod:`.ingest`). The changelog tail's ops of that key group are applied
first, to its decoded entries in a dict (stored key -> stored value, the store's own
layout), through :func:`~.mutation.mutate_columns` like every other path: so the ingested
file holds the key group's final state, and the tail costs no store reads (every key
the tail touches would otherwise be a cold point read of an ingested file) and no write
batches.

:class:`GroupWrites` is the :class:`~.mutation.ColumnWrites` of such a dict. The
map queries (is a map empty, its entries) need the entries under a map's prefix: the
dict's keys are sorted once, at the first such query, and the map entries the ops add
afterwards are kept by map.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence


class GroupWrites:
    """:class:`~.mutation.ColumnWrites` over ``entries`` (stored key -> value of
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

    def read_ahead(self, keys: Sequence[bytes]) -> None:
        pass  # every entry is in memory

    def settle_all(self, keys: Sequence[bytes], new: Sequence[bytes | None],
                   marked: Sequence[bytes] | None = None,
                   starts: Sequence[bytes] | None = None) -> int:
        """:meth:`settle` of each key in order: puts only (the usual run: a value state's
        sets, a map's puts) in one dict update, the count's change from the dict's size."""
        if self.mark is not None:
            mark = self.mark
            self.marks += [mark + key for key in (keys if marked is None else marked)]
        entries = self.entries
        if starts is not None and self._index is not None:
            added = self._added
            for key, start in zip(keys, starts, strict=True):
                if key not in entries:
                    added.setdefault(start, set()).add(key)
        before = len(entries)
        if None in new:
            pop = entries.pop
            for key, data in zip(keys, new, strict=True):
                if data is None:
                    pop(key, None)
                else:
                    entries[key] = data
        else:
            entries.update(zip(keys, new, strict=True))  # type: ignore[arg-type]
        return len(entries) - before

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
