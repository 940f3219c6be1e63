"""Which keys a RocksDB state table's mutations touched, by change epoch.

With ``track_changes``, every mutation (not a snapshot load) also writes a mark
``ff ff 02 epoch(8) kg(2) sid(2) key`` -> nothing, which an incremental materialization
reads to find what changed since the last one. The epoch comes first, so forgetting
the epochs a snapshot holds is one range deletion; the current epoch is stored at
``ff ff 03``, and ``ff ff 04`` is present while every mutation since the store was empty
was marked (see :mod:`kafka_changelog.state.rocksdb.keys`).

A materialization ends the current epoch when it starts (:meth:`ChangeTracker.start_epoch`),
so keys touched while it runs are marked with the next one, and forgets the ended
epoch's marks when its snapshot is written (:meth:`ChangeTracker.clear`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .keys import CHANGED, EPOCH, INT64, TRACKED

#: (key, value) of every stored key starting with a prefix, in key order.
Scan = Callable[[bytes], Iterator[tuple[bytes, bytes]]]


def _epoch_prefix(epoch: int) -> bytes:
    return CHANGED + INT64.pack(epoch)


class ChangeTracker:
    """The change epochs and changed-key marks of one open store.

    Invariant: :attr:`mark` is the prefix of the current epoch's marks when tracking,
    None when not; the mutation path writes ``mark + kg sid key`` with each change.
    """

    def __init__(self, db: Any, write_options: Any, batch_type: Any, scan: Scan, *,
                 tracking: bool, empty: bool) -> None:
        """Read the store's epoch; ``tracking`` with an ``empty`` store starts a complete
        record of changes, no ``tracking`` ends it (changes go unmarked from now on)."""
        self._db, self._write_options = db, write_options
        self._batch_type, self._scan = batch_type, scan
        stored = db.get(EPOCH)
        self.epoch: int = INT64.unpack(stored)[0] if stored is not None else 0
        self.mark: bytes | None = _epoch_prefix(self.epoch) if tracking else None
        if tracking:
            if empty:
                db.put(TRACKED, b"", write_options)
        elif db.get(TRACKED) is not None:
            db.delete(TRACKED, write_options)

    @property
    def complete(self) -> bool:
        """Whether every mutation since the store was empty was marked."""
        return self._db.get(TRACKED) is not None

    def start_epoch(self) -> int:
        """End the current epoch (returned): marks go to the next one from now on."""
        ended = self.epoch
        self.epoch += 1
        if self.mark is not None:
            self.mark = _epoch_prefix(self.epoch)
        self._db.put(EPOCH, INT64.pack(self.epoch), self._write_options)
        return ended

    def clear(self, upto: int) -> None:
        """Forget the marks of the epochs up to ``upto``: one range deletion."""
        batch = self._batch_type(raw_mode=True)
        batch.delete_range(CHANGED, _epoch_prefix(upto + 1))
        self._db.write(batch, self._write_options)

    def changed_keys_by_group(self, names: Mapping[bytes, str]
                              ) -> Iterator[tuple[int, list[tuple[str, bytes]]]]:
        """(key group, its (state, key) marked in any epoch not forgotten) for every key
        group with marks, ascending; ``names`` maps state numbers to names (marks of
        other numbers are skipped). One pass over each epoch's marks, merged; one key
        group's keys in memory at a time; a key marked in several epochs once."""
        cut = len(CHANGED) + 8
        epochs = []
        for epoch in self._marked_epochs():
            epochs.append(((int.from_bytes(k[cut:cut + 2], "big"), k[cut + 2:])
                           for k, _ in self._scan(_epoch_prefix(epoch))))
        current = -1
        found: dict[tuple[str, bytes], None] = {}
        for key_group, rest in heapq.merge(*epochs):
            if key_group != current:
                if found:
                    yield current, list(found)
                current, found = key_group, {}
            name = names.get(rest[:2])
            if name is not None:
                found[(name, rest[2:])] = None
        if found:
            yield current, list(found)

    def _marked_epochs(self) -> list[int]:
        """The epochs that have marks, ascending (one seek each)."""
        epochs = []
        iterator = self._db.iter()
        iterator.seek(CHANGED)
        while iterator.valid():
            key = iterator.key()
            if not key.startswith(CHANGED):
                break
            epoch = INT64.unpack(key[len(CHANGED):len(CHANGED) + 8])[0]
            epochs.append(epoch)
            iterator.seek(_epoch_prefix(epoch + 1))
        return epochs


__all__ = ["ChangeTracker"]
