"""What each state op does to a RocksDB state table's store, written once.

:func:`mutate` plans one op's effect (the stored keys it puts and deletes, and how the
entry count changes) from what the store holds, and carries it out through a
:class:`StoreWrites`: the single path (:meth:`RocksDBStateTable.apply
<kafka_changelog.state.rocksdb.table.RocksDBStateTable.apply>`) writes straight to the
store (:class:`DirectWrites`); the batched and columnar paths (``apply_batch``,
``apply_columns``) write into write batches and read through what they wrote before
(:class:`BatchedWrites`). So the three paths cannot disagree about an op's meaning, only
about how they read and write.

The entry count is the number of stored entries: a key of a value or list state is one,
a map counts each of its entries (one stored key each). So an op's count change is
whether the stored key it writes existed, a point read that a multi-get serves in bulk,
never a seek into a map's range to learn whether the map is empty. :class:`SeenKeys`
remembers, up to a bound, whether the keys read or written last exist (the table is its
store's only writer), which makes the read-modify-writes of the state API and of bulk
state one lookup per key, not two.
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

    def settle(self, key: bytes, new: bytes | None, start: bytes | None = None) -> int:
        """Make a stored key hold ``new`` (None: delete it, if present; a map entry's map
        ``start`` given); returns the entry count's change (+1 new, -1 deleted, 0)."""
        ...

    def stored(self, key: bytes) -> bytes | None:
        """A stored key's bytes (None: absent)."""
        ...

    def map_entries(self, start: bytes) -> list[bytes]:
        """The stored keys of a map's entries."""
        ...

    def delete(self, keys: Sequence[bytes], start: bytes | None = None) -> None:
        """Delete stored keys (a map's entries: its ``start`` given)."""
        ...

    def put_mark(self, key: bytes) -> None:
        """Write a change mark."""
        ...


class ColumnWrites(StoreWrites, Protocol):
    """:class:`StoreWrites` that also take many settles at once (:func:`mutate_columns`)."""

    def read_ahead(self, keys: Sequence[bytes]) -> None:
        """Learn in bulk whether the stored keys exist, where later settles need it."""
        ...

    def settle_all(self, keys: Sequence[bytes], new: Sequence[bytes | None],
                   marked: Sequence[bytes] | None = None,
                   starts: Sequence[bytes] | None = None) -> int:
        """:meth:`settle` of each stored key in order, each marked first when
        :attr:`mark` is set (``marked[i]`` the key to mark, default ``keys[i]``; a map
        entry's map ``starts[i]`` given); returns the entry count's change."""
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
            return io.settle(start + map_key, value, start)
        if op is MAP_REMOVE:
            assert map_key is not None
            return io.settle(start + map_key, None, start)
        entries = io.map_entries(start)  # DELETE: the whole map
        if entries:
            io.delete(entries, start)
        return -len(entries)
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


def mutate_columns(io: ColumnWrites, kind: int, op: OpKind, prefixes: Sequence[bytes],
                   keys: Sequence[bytes], map_keys: Sequence[bytes | None] | None,
                   values: Sequence[bytes | None] | None,
                   items: Sequence[Sequence[bytes] | None] | None) -> int:
    """:func:`mutate` of many ops of one kind, in order (op ``i``: ``prefixes[i]``,
    ``keys[i]``, and of each column given its ``i``-th item; a column None is None for
    every op); returns the entry count's change. The ops that write one stored key each
    (a value's set or delete, a map entry's put or remove) go through
    :meth:`ColumnWrites.settle_all` with the keys read ahead at once; the rest op by op."""
    count = len(keys)
    if not count:
        return 0
    none: list[None] = [None] * count
    if kind != KIND_MAP:
        stored = [prefix + key for prefix, key in zip(prefixes, keys, strict=True)]
        io.read_ahead(stored)
        if kind == KIND_VALUE and (op is DELETE or (op is SET and values is not None)):
            return io.settle_all(stored, none if op is DELETE or values is None else values)
    elif map_keys is not None and (op is MAP_REMOVE or (op is MAP_PUT and values is not None)):
        # Each op writes one stored entry: no map is read.
        starts = [map_start(prefix, key) for prefix, key in zip(prefixes, keys, strict=True)]
        entries = [start + map_key  # type: ignore[operator]
                   for start, map_key in zip(starts, map_keys, strict=True)]
        io.read_ahead(entries)
        marked = (None if io.mark is None else
                  [prefix + key for prefix, key in zip(prefixes, keys, strict=True)])
        new = none if op is MAP_REMOVE or values is None else values
        return io.settle_all(entries, new, marked, starts)
    change = 0
    for prefix, key, map_key, value, listed in zip(
            prefixes, keys, none if map_keys is None else map_keys,
            none if values is None else values, none if items is None else items,
            strict=True):
        change += mutate(io, kind, op, prefix, key, map_key, value, listed)
    return change


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

    def settle(self, key: bytes, new: bytes | None, start: bytes | None = None) -> int:
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

    def stored(self, key: bytes) -> bytes | None:
        data: bytes | None = self._db.get(key)
        self._seen.saw(key, data is not None)
        return data

    def map_entries(self, start: bytes) -> list[bytes]:
        return [key for key, _ in self._scan(start)]

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
    batch if it holds writes to that map (``_maps`` names those).
    """

    def __init__(self, db: Any, write_options: Any, batch_type: Any, seen: SeenKeys,
                 scan: Scan, mark: bytes | None, counting: bool = True) -> None:
        """``counting`` False: writes do not find out whether the keys existed (the
        caller sets the entry count itself); the count changes they return are 0."""
        self._db, self._write, self._batch_type = db, write_options, batch_type
        self._seen, self._known = seen, seen.known
        self._scan = scan
        self.mark = mark
        self.counting = counting
        self._batch = batch_type(raw_mode=True)
        self._values: dict[bytes, bytes | None] = {}
        self._maps: set[bytes] = set()

    def prefetch(self, keys: Iterable[bytes]) -> None:
        """Read the keys with one multi-get, in key order (RocksDB reads neighbouring
        keys together)."""
        values = self._values
        wanted = sorted({key for key in keys if key not in values})
        if wanted:
            values.update(zip(wanted, self._db.get(wanted), strict=True))

    def read_ahead(self, keys: Sequence[bytes]) -> None:
        """:meth:`prefetch` of the keys :class:`SeenKeys` does not know (a replay's keys
        are mostly unknown to it); nothing when not :attr:`counting`."""
        if self.counting:
            known = self._known
            self.prefetch([key for key in keys if key not in known])

    def settle(self, key: bytes, new: bytes | None, start: bytes | None = None) -> int:
        if start is not None:
            self._maps.add(start)
        values = self._values
        old: object = values.get(key, _UNREAD)
        if old is not _UNREAD:
            existed: bool | None = old is not None
        else:
            existed = self._known.get(key)
            if existed is None and self.counting:
                existed = self._db.get(key) is not None
        values[key] = new
        batch = self._batch
        if new is not None:
            batch.put(key, new)
            change = 0 if existed else 1
        elif existed is not False:  # a delete of a key known absent: none written
            batch.delete(key)
            change = -1 if existed else 0
        else:
            return 0
        if len(batch) >= BATCH_LIMIT:
            self.flush()
        return change if self.counting else 0

    def settle_all(self, keys: Sequence[bytes], new: Sequence[bytes | None],
                   marked: Sequence[bytes] | None = None,
                   starts: Sequence[bytes] | None = None) -> int:
        """:meth:`settle` of each stored key, in order, in one loop, each marked first
        when :attr:`mark` is set (``marked[i]`` is ``keys[i]``'s key to mark, e.g. a
        map entry's map key; default ``keys[i]`` itself); returns the entry count's
        change (0 when not :attr:`counting`). ``starts`` are not noted (no set of every
        map on this hot path): a caller must not read those maps through this object
        afterwards, and :func:`mutate_columns`, each call with one of its own, does not."""
        values, known, db, mark = self._values, self._known, self._db, self.mark
        batch = self._batch
        change = 0
        counting = self.counting
        for key, data, marks in zip(keys, new, keys if marked is None else marked,
                                    strict=True):
            if mark is not None:
                batch.put(mark + marks, b"")
            old: object = values.get(key, _UNREAD)
            if old is not _UNREAD:
                existed: bool | None = old is not None
            else:
                existed = known.get(key)
                if existed is None and counting:
                    existed = db.get(key) is not None
            values[key] = data
            if data is not None:
                batch.put(key, data)
                change += not existed
            elif existed is not False:  # a delete of a key known absent: none written
                batch.delete(key)
                change -= existed is True
            if len(batch) >= BATCH_LIMIT:
                self.flush()
                batch = self._batch
        return change if counting else 0

    def stored(self, key: bytes) -> bytes | None:
        values = self._values
        if key in values:
            return values[key]
        data: bytes | None = self._db.get(key)
        values[key] = data
        return data

    def map_entries(self, start: bytes) -> list[bytes]:
        if start in self._maps:
            self.flush()
        return [key for key, _ in self._scan(start)]

    def delete(self, keys: Sequence[bytes], start: bytes | None = None) -> None:
        batch, values = self._batch, self._values
        for key in keys:
            batch.delete(key)
            values[key] = None
        if start is not None:
            self._maps.add(start)
        if len(batch) >= BATCH_LIMIT:
            self.flush()

    def put_mark(self, key: bytes) -> None:
        self._batch.put(key, b"")

    def flush(self) -> None:
        """Write the batch: the store holds every write so far."""
        if len(self._batch):
            self._db.write(self._batch, self._write)
            self._batch = self._batch_type(raw_mode=True)  # a written batch is not reused
        self._maps.clear()

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
           "BatchedWrites", "ColumnWrites", "DirectWrites", "SeenKeys", "StoreWrites",
           "any_under", "mutate", "mutate_columns"]
