"""What each state op does to a RocksDB state table's store, written once.

:func:`mutate` plans one op's effect (the stored keys it puts and deletes, and how the
entry count changes) from what the store holds, and carries it out through a
:class:`StoreWrites`: the single path (:meth:`RocksDBStateTable.apply
<kafka_changelog.state.rocksdb.table.RocksDBStateTable.apply>`) writes straight to the
store (:class:`DirectWrites`); the batched and columnar paths (``apply_batch``,
``apply_columns``) write into write batches and read through what they wrote before
(:class:`BatchedWrites`). So the three paths cannot disagree about an op's meaning, only
about how they read and write.

The entry count changes as entries come and go: a key of a value or list state is one
entry, a map is one entry while it has a map entry. Keeping it needs to know whether a
key exists before it is written; :class:`SeenKeys` remembers, up to a bound, the keys
read or written last (the table is its store's only writer), which makes the
read-modify-writes of the state API and of bulk state one lookup per key, not two.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from typing import Any, Protocol

from ..schema.ops import DELETE, LIST_ADD, LIST_REPLACE, MAP_PUT, MAP_REMOVE, SET, OpKind
from .keys import encode_items, map_start, prefix_end

#: How a state's entries are stored (:mod:`kafka_changelog.state.rocksdb.keys`).
KIND_VALUE, KIND_LIST, KIND_MAP = 0, 1, 2
#: The ops each storage kind takes (by kind); any other is refused before anything is
#: written. Tuples, not sets: ``in`` compares members by identity, never hashing an enum
#: (a Python-level ``__hash__``) on every op.
ALLOWED: tuple[tuple[OpKind, ...], ...] = (
    (SET, DELETE),
    (LIST_ADD, LIST_REPLACE, DELETE),
    (MAP_PUT, MAP_REMOVE, DELETE),
)
#: Changes per write batch (bounds a batch's memory).
BATCH_LIMIT = 20_000
#: Stored keys whose existence a table remembers (:class:`SeenKeys`).
SEEN_LIMIT = 200_000
# What BatchedWrites holds for a key it has not read.
_UNREAD = object()


class SeenKeys:
    """Whether stored keys exist, as last read or written by the table (its store's only
    writer), for at most ``limit`` keys (past it, everything is forgotten at once: only
    lookups are lost)."""

    __slots__ = ("known", "limit")

    def __init__(self, limit: int = SEEN_LIMIT) -> None:
        #: Stored key -> present. Cleared in place, never replaced.
        self.known: dict[bytes, bool] = {}
        self.limit = limit

    def saw(self, key: bytes, found: bool) -> None:
        known = self.known
        if len(known) >= self.limit:
            known.clear()
        known[key] = found

    def saw_all(self, found: dict[bytes, bool]) -> None:
        known = self.known
        if len(known) + len(found) > self.limit:
            known.clear()
        if len(found) <= self.limit:
            known.update(found)

    def clear(self) -> None:
        self.known.clear()


class Scan(Protocol):
    """(key, value) of every stored key starting with a prefix, in key order."""

    def __call__(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...


class StoreWrites(Protocol):
    """How :func:`mutate` reads the store and writes an op's effect into it. Reads see
    every write made through the same object before them."""

    #: The current change epoch's mark prefix (None: changes are not tracked).
    mark: bytes | None

    def settle(self, key: bytes, new: bytes | None) -> int:
        """Make a key of a value or list state hold ``new`` (None: delete it, if present);
        returns the entry count's change (+1 new, -1 deleted, 0)."""
        ...

    def exists(self, key: bytes) -> bool:
        """Whether a stored key is present."""
        ...

    def stored(self, key: bytes) -> bytes | None:
        """A stored key's bytes (None: absent)."""
        ...

    def map_filled(self, start: bytes, member: bytes) -> bool:
        """Whether a map (its entries start with ``start``) has an entry (``member``, one
        of its possible entries, may be known to be present)."""
        ...

    def map_filled_besides(self, start: bytes, entry: bytes) -> bool:
        """Whether a map has an entry other than ``entry``."""
        ...

    def map_entries(self, start: bytes) -> list[bytes]:
        """The stored keys of a map's entries."""
        ...

    def put(self, key: bytes, value: bytes, start: bytes | None = None) -> None:
        """Store ``value`` at ``key`` (a map entry's map ``start`` given)."""
        ...

    def delete(self, keys: Sequence[bytes], start: bytes | None = None) -> None:
        """Delete stored keys (a map's entries: its ``start`` given)."""
        ...

    def put_mark(self, key: bytes) -> None:
        """Write a change mark."""
        ...


def mutate(io: StoreWrites, kind: int, op: OpKind, prefix: bytes, key: bytes,
           map_key: bytes | None, value: bytes | None,
           values: Sequence[bytes] | None) -> int:
    """Carry out one op on the store through ``io``; returns the entry count's change.

    ``prefix`` is the state's in the key group, ``kind`` its storage kind, and ``op`` one
    of :data:`ALLOWED` for it (callers check: nothing is written for a refused op).
    A key touched is marked when ``io.mark`` is set. Deletes of absent keys are not
    written.
    """
    if io.mark is not None:
        io.put_mark(io.mark + prefix + key)
    if kind == KIND_MAP:
        start = map_start(prefix, key)
        if op is MAP_PUT:
            assert map_key is not None and value is not None
            entry = start + map_key
            first = not io.map_filled(start, entry)
            io.put(entry, value, start)
            return int(first)
        if op is MAP_REMOVE:
            assert map_key is not None
            entry = start + map_key
            if not io.exists(entry):
                return 0
            last = not io.map_filled_besides(start, entry)
            io.delete((entry,), start)
            return -int(last)
        entries = io.map_entries(start)  # DELETE: the whole map
        if not entries:
            return 0
        io.delete(entries, start)
        return -1
    stored = prefix + key
    if op is SET:
        assert value is not None
        return io.settle(stored, value)
    if op is LIST_ADD:  # appends bytes: the one op that reads the stored value
        assert values is not None
        old = io.stored(stored)
        added = encode_items(values)
        return io.settle(stored, added if old is None else old + added)
    if op is LIST_REPLACE:
        assert values is not None
        return io.settle(stored, encode_items(values) if values else None)  # no items: none
    return io.settle(stored, None)  # DELETE


def any_under(db: Any, start: bytes, besides: bytes | None = None) -> bool:
    """Whether ``db`` holds a key starting with ``start`` other than ``besides`` (one
    seek, bounded above by the prefix's end: without the bound, a seek past deleted keys
    reads every tombstone up to the next live key, maybe other keys' many deleted
    entries, e.g. after thousands of timers were deleted in one write)."""
    end = prefix_end(start)
    if end is None:
        iterator = db.iter()
    else:
        bounded = _read_options()
        bounded.set_iterate_upper_bound(end)
        iterator = db.iter(bounded)
    iterator.seek(start)
    if besides is not None and iterator.valid() and iterator.key() == besides:
        iterator.next()
    return bool(iterator.valid() and iterator.key().startswith(start))


def _read_options() -> Any:
    """A new ``rocksdict.ReadOptions``."""
    return _read_options_type()()


@cache
def _read_options_type() -> Any:
    # Imported here (once): rocksdict is needed only when a RocksDB table is used.
    from rocksdict import ReadOptions

    return ReadOptions


class DirectWrites:
    """Each write goes to the store at once (the single path: one op at a time); reads
    go to the store unless :class:`SeenKeys` knows the answer."""

    def __init__(self, db: Any, write_options: Any, batch_type: Any, seen: SeenKeys,
                 scan: Scan, mark: bytes | None) -> None:
        self._db, self._write, self._batch_type = db, write_options, batch_type
        self._seen, self._known = seen, seen.known
        self._scan = scan
        self.mark = mark

    def settle(self, key: bytes, new: bytes | None) -> int:
        known = self._known
        existed = known.get(key)
        if existed is None:
            existed = self._db.get(key) is not None
        if len(known) >= self._seen.limit:
            known.clear()  # SeenKeys.saw, inline: this runs for every change
        if new is not None:
            self._db.put(key, new, self._write)
            known[key] = True
            return 0 if existed else 1
        known[key] = False
        if existed:
            self._db.delete(key, self._write)
            return -1
        return 0

    def exists(self, key: bytes) -> bool:
        found = self._known.get(key)
        if found is None:
            found = self._db.get(key) is not None
            self._seen.saw(key, found)
        return found

    def stored(self, key: bytes) -> bytes | None:
        data: bytes | None = self._db.get(key)
        self._seen.saw(key, data is not None)
        return data

    def map_filled(self, start: bytes, member: bytes) -> bool:
        return bool(self._known.get(member)) or any_under(self._db, start)

    def map_filled_besides(self, start: bytes, entry: bytes) -> bool:
        return any_under(self._db, start, entry)

    def map_entries(self, start: bytes) -> list[bytes]:
        return [key for key, _ in self._scan(start)]

    def put(self, key: bytes, value: bytes, start: bytes | None = None) -> None:
        self._db.put(key, value, self._write)
        self._seen.saw(key, True)

    def delete(self, keys: Sequence[bytes], start: bytes | None = None) -> None:
        if len(keys) == 1:
            self._db.delete(keys[0], self._write)
        else:  # a whole map: one write
            batch = self._batch_type(raw_mode=True)
            for key in keys:
                batch.delete(key)
            self._db.write(batch, self._write)
        saw = self._seen.saw
        for key in keys:
            saw(key, False)

    def put_mark(self, key: bytes) -> None:
        self._db.put(key, b"", self._write)


class BatchedWrites:
    """Writes go into write batches of at most :data:`BATCH_LIMIT` changes; reads see
    them (the batched and columnar paths). :meth:`finish` writes the last batch and
    tells :class:`SeenKeys` what the store holds now.

    Invariant: every key written here is in ``_values`` with the bytes it holds after
    the writes (None: absent), so a read of it never goes to the store, which may not
    hold the write yet. A map's entries are read from the store, after writing the
    batch if it holds writes to that map; until then ``_filled`` names the maps this
    batch put an entry in (and removed none from: those are in ``_dirty``).
    """

    def __init__(self, db: Any, write_options: Any, batch_type: Any, seen: SeenKeys,
                 scan: Scan, mark: bytes | None, counting: bool = True) -> None:
        """``counting`` False: :meth:`settle_all` does not find out whether the keys
        existed (the caller sets the entry count itself)."""
        self._db, self._write, self._batch_type = db, write_options, batch_type
        self._seen, self._known = seen, seen.known
        self._scan = scan
        self.mark = mark
        self.counting = counting
        self._batch = batch_type(raw_mode=True)
        self._values: dict[bytes, bytes | None] = {}
        self._filled: set[bytes] = set()
        self._dirty: set[bytes] = set()

    def prefetch(self, keys: Iterable[bytes]) -> None:
        """Read the keys with one multi-get, in key order (RocksDB reads neighbouring
        keys together)."""
        values = self._values
        wanted = sorted({key for key in keys if key not in values})
        if wanted:
            values.update(zip(wanted, self._db.get(wanted), strict=True))

    def settle(self, key: bytes, new: bytes | None) -> int:
        values = self._values
        old: object = values.get(key, _UNREAD)
        if old is _UNREAD:
            existed = self._known.get(key)
            if existed is None:
                existed = self._db.get(key) is not None
        else:
            existed = old is not None
        values[key] = new
        batch = self._batch
        if new is not None:
            batch.put(key, new)
            change = 0 if existed else 1
        elif existed:
            batch.delete(key)
            change = -1
        else:
            return 0  # nothing to delete, nothing written
        if len(batch) >= BATCH_LIMIT:
            self.flush()
        return change

    def settle_all(self, keys: Sequence[bytes], new: Sequence[bytes | None]) -> int:
        """:func:`mutate` of a SET (``new[i]`` not None) or DELETE of each stored key of a
        value state, in order, in one loop (the same writes, marks and count); returns the
        entry count's change (0 when not :attr:`counting`)."""
        values, known, db, mark = self._values, self._known, self._db, self.mark
        batch = self._batch
        if not self.counting:
            for key, data in zip(keys, new, strict=True):
                if mark is not None:
                    batch.put(mark + key, b"")
                values[key] = data
                if data is not None:
                    batch.put(key, data)
                elif known.get(key) is not False:  # a delete of a key known absent: none
                    batch.delete(key)
                if len(batch) >= BATCH_LIMIT:
                    self.flush()
                    batch = self._batch
            return 0
        change = 0
        for key, data in zip(keys, new, strict=True):
            if mark is not None:
                batch.put(mark + key, b"")
            old: object = values.get(key, _UNREAD)
            if old is _UNREAD:
                existed = known.get(key)
                if existed is None:
                    existed = db.get(key) is not None
            else:
                existed = old is not None
            values[key] = data
            if data is not None:
                batch.put(key, data)
                change += not existed
            elif existed:
                batch.delete(key)
                change -= 1
            if len(batch) >= BATCH_LIMIT:
                self.flush()
                batch = self._batch
        return change

    def exists(self, key: bytes) -> bool:
        values = self._values
        if key in values:
            return values[key] is not None
        found = self._known.get(key)
        if found is None:
            data = values[key] = self._db.get(key)
            found = data is not None
        return found

    def stored(self, key: bytes) -> bytes | None:
        values = self._values
        if key in values:
            return values[key]
        data: bytes | None = self._db.get(key)
        values[key] = data
        return data

    def map_filled(self, start: bytes, member: bytes) -> bool:
        if start in self._filled:
            return True
        values = self._values
        if values.get(member) is not None or (member not in values
                                              and self._known.get(member)):
            return True
        if start in self._dirty:
            self.flush()
        return any_under(self._db, start)

    def map_filled_besides(self, start: bytes, entry: bytes) -> bool:
        if start in self._filled or start in self._dirty:
            self.flush()
        return any_under(self._db, start, entry)

    def map_entries(self, start: bytes) -> list[bytes]:
        if start in self._filled or start in self._dirty:
            self.flush()
        return [key for key, _ in self._scan(start)]

    def put(self, key: bytes, value: bytes, start: bytes | None = None) -> None:
        self._batch.put(key, value)
        self._values[key] = value
        if start is not None:
            self._filled.add(start)
        if len(self._batch) >= BATCH_LIMIT:
            self.flush()

    def delete(self, keys: Sequence[bytes], start: bytes | None = None) -> None:
        batch, values = self._batch, self._values
        for key in keys:
            batch.delete(key)
            values[key] = None
        if start is not None:
            self._filled.discard(start)
            self._dirty.add(start)
        if len(batch) >= BATCH_LIMIT:
            self.flush()

    def put_mark(self, key: bytes) -> None:
        self._batch.put(key, b"")

    def flush(self) -> None:
        """Write the batch: the store holds every write so far."""
        if len(self._batch):
            self._db.write(self._batch, self._write)
            self._batch = self._batch_type(raw_mode=True)  # a written batch is not reused
        self._filled.clear()
        self._dirty.clear()

    def finish(self, remember: bool = True) -> None:
        """Write the last batch; ``remember``: tell :class:`SeenKeys` what the keys read
        or written hold, else forget what it knew (it may be stale now). On a failure to
        write, everything is forgotten: what the store holds is not known."""
        try:
            self.flush()
        except BaseException:
            self._seen.clear()
            raise
        if remember:
            self._seen.saw_all({key: data is not None for key, data in self._values.items()})
        else:
            self._seen.clear()


__all__ = ["ALLOWED", "BATCH_LIMIT", "KIND_LIST", "KIND_MAP", "KIND_VALUE", "SEEN_LIMIT",
           "BatchedWrites", "DirectWrites", "SeenKeys", "StoreWrites", "any_under", "mutate"]
