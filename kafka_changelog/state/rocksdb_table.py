"""A keyed state table in RocksDB (``rocksdict``, the binding Quix Streams uses).

One RocksDB per store directory holds the entries of a backend's key groups, so state
larger than memory fits and a store on local disk outlives the process (streaming
reattaches it: see :mod:`kafka_changelog.state.local_store`). The changelog in Kafka
stays the durable log; this is only the working copy.

Layout (every key starts with its key group, so a key group is one contiguous range
and materialization, rescaling and readers iterate it per key group):

- value, reducing and aggregating states: ``kg(2) sid(2) key`` -> the value;
- list states: ``kg(2) sid(2) key`` -> the items, each as a 4-byte big-endian length
  and its bytes (``LIST_ADD`` appends bytes to the stored value, never decoding it);
- map states: ``kg(2) sid(2) esc(key) 00 01 map_key`` -> the value, one RocksDB entry
  per map entry (``MAP_PUT`` and a read of one map key touch that entry only);
  ``esc`` doubles as ``00 ff`` every ``00`` of the key, which keeps keys in byte order
  and makes ``00 01`` end the key;
- registrations: ``ff ff 00 name`` -> ``sid(2)`` and the ``StateMeta`` bytes; the entry
  count: ``ff ff 01`` (key groups are below 2^15, so ``ff ff`` is never one);
- with ``track_changes``: ``ff ff 02 epoch(8) kg(2) sid(2) key`` -> nothing, for every
  key a mutation touched (not a snapshot load) in that change epoch, which an incremental
  materialization reads (:meth:`RocksDBStateTable.changed_keys_by_group`; the epoch
  first, so that forgetting epochs is one range deletion), the current epoch at
  ``ff ff 03``, and ``ff ff 04`` while every mutation since the store was empty was
  tracked (:attr:`RocksDBStateTable.changes_complete`).

``kg`` is the key group and ``sid`` the state's number (in registration order), both
big-endian. The entry count is kept as entries come and go: a write first looks its key
up, unless the table already knows whether it exists (it remembers, up to a bound, the
keys it read or wrote last: the table is its store's only writer), which makes the
read-modify-writes of the state API and of bulk state one lookup per key, not two.
Iterating a state's prefix gives its entries ordered by key and map key, which is the
order of :meth:`RocksDBStateTable.serialize_group`: it writes exactly the bytes of the
in-memory table's for the same state, so snapshots are interchangeable.

Writes skip RocksDB's write-ahead log: the Kafka changelog is the durable log, and a
store is only trusted again (:meth:`RocksDBStateTable.flush`, then a manifest written
by the caller) after it was flushed to disk whole.

``rocksdict`` is imported when a table is opened, not with this module: without it,
opening raises :class:`~kafka_changelog.state.errors.StateBackendUnavailableError`.
"""

from __future__ import annotations

import contextlib
import heapq
import shutil
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .descriptors import StateKind
from .errors import StateBackendUnavailableError, StateMismatchError
from .key_group_codec import (
    SHAPE_LIST,
    SHAPE_MAP,
    SHAPE_VALUE,
    StateLoad,
    assemble_key_group,
    encode_entries,
    encode_value_entries,
    load_key_group,
)
from .ops import (
    DELETE,
    LIST_ADD,
    LIST_REPLACE,
    MAP_PUT,
    MAP_REMOVE,
    SET,
    OpKind,
    StateMeta,
    StateOp,
    ops_of_columns,
)
from .table import describe_meta
from .table_protocol import Entry

_RESERVED = b"\xff\xff"
_META = _RESERVED + b"\x00"
_COUNT = _RESERVED + b"\x01"
_CHANGED = _RESERVED + b"\x02"
_EPOCH = _RESERVED + b"\x03"
_TRACKED = _RESERVED + b"\x04"
_KEY_END = b"\x00\x01"
_NUL, _ESCAPED_NUL = b"\x00", b"\x00\xff"
_LENGTH = struct.Struct(">I")
_COUNT_FORMAT = struct.Struct(">q")
_KIND_VALUE, _KIND_LIST, _KIND_MAP = 0, 1, 2
#: Puts per write batch when a key group is loaded (bounds the batch's memory).
_LOAD_BATCH = 20_000
#: Stored keys whose existence a table remembers (see ``RocksDBStateTable._seen``).
_SEEN_LIMIT = 200_000
#: RocksDB's memtable per store before it is flushed to a file.
_WRITE_BUFFER_BYTES = 32 << 20

_shared: dict[str, Any] = {}
_shared_lock = threading.Lock()


def _rocksdict() -> Any:
    """The ``rocksdict`` module, or a clear error naming the package to install."""
    try:
        import rocksdict
    except ImportError as exc:
        raise StateBackendUnavailableError(
            "the RocksDB state backend needs the 'rocksdict' package: pip install rocksdict "
            "(or pip install 'kafka-changelog[rocksdb]')") from exc
    return rocksdict


def _options(rocks: Any) -> tuple[Any, Any]:
    """RocksDB options and write options, shared by the stores of a process (one block
    cache for all of them)."""
    with _shared_lock:
        if "options" not in _shared:
            table = rocks.BlockBasedOptions()
            table.set_block_cache(rocks.Cache(64 << 20))
            table.set_bloom_filter(10, False)  # most point reads of new keys miss
            options = rocks.Options(raw_mode=True)
            options.create_if_missing(True)
            options.set_write_buffer_size(_WRITE_BUFFER_BYTES)
            options.set_max_write_buffer_number(2)
            options.set_block_based_table_factory(table)
            options.set_compression_type(rocks.DBCompressionType.lz4())
            options.set_keep_log_file_num(1)
            write = rocks.WriteOptions()
            write.disable_wal = True  # the changelog is the durable log
            _shared["options"], _shared["write"] = options, write
        return _shared["options"], _shared["write"]


class _BoundedBatch:
    """Puts and deletes in write batches of at most ``_LOAD_BATCH`` changes (a batch's
    memory stays bounded); :meth:`finish` writes the last one."""

    def __init__(self, db: Any, batch_type: Any, write_options: Any) -> None:
        self._db, self._batch_type, self._write_options = db, batch_type, write_options
        self._batch = batch_type(raw_mode=True)

    def put(self, key: bytes, value: bytes) -> None:
        self._batch.put(key, value)
        if len(self._batch) >= _LOAD_BATCH:
            self.finish()

    def delete(self, key: bytes) -> None:
        self._batch.delete(key)
        if len(self._batch) >= _LOAD_BATCH:
            self.finish()

    def finish(self) -> None:
        if len(self._batch):
            self._db.write(self._batch, self._write_options)
            self._batch = self._batch_type(raw_mode=True)  # a written batch is not reused


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key after every key starting with ``prefix`` (None: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _map_start(prefix: bytes, key: bytes) -> bytes:
    """Where the entries of ``key``'s map start under a state's ``prefix``: the key
    escaped (``00`` as ``00 ff``), then ``00 01``."""
    return prefix + key.replace(_NUL, _ESCAPED_NUL) + _KEY_END


def _key_group_prefix(key_group: int) -> bytes:
    return key_group.to_bytes(2, "big")


def _encode_items(values: tuple[bytes, ...] | list[bytes]) -> bytes:
    pack = _LENGTH.pack
    return b"".join([part for v in values for part in (pack(len(v)), v)])


def _decode_items(data: bytes) -> list[bytes]:
    items = []
    unpack = _LENGTH.unpack_from
    position, end = 0, len(data)
    while position < end:
        (size,) = unpack(data, position)
        position += 4
        items.append(data[position:position + size])
        position += size
    return items


class _State:
    """A registered state: its meta, key prefix number and storage kind."""

    __slots__ = ("kind", "meta", "sid")

    def __init__(self, meta: StateMeta, sid: bytes) -> None:
        self.meta = meta
        self.sid = sid
        self.kind = (_KIND_MAP if meta.kind is StateKind.MAP
                     else _KIND_LIST if meta.kind is StateKind.LIST else _KIND_VALUE)


class RocksDBStateTable:
    """Keyed state in one RocksDB at ``path`` (created if missing, reopened if present).

    Implements :class:`~kafka_changelog.state.table_protocol.KeyedStateTable`. One
    operator thread uses it, like the in-memory table. ``remove_on_close`` deletes the
    directory in :meth:`close` (a working copy nobody reattaches).
    """

    def __init__(self, path: str | Path, *, remove_on_close: bool = False,
                 track_changes: bool = False) -> None:
        """``track_changes``: remember which keys mutations touched, by change epoch (see
        :meth:`changed_keys`), for incremental materializations."""
        self.path = Path(path)
        self._remove_on_close = remove_on_close
        self._tracking = track_changes
        self._db: Any = None
        self.reopen()

    def reopen(self) -> None:
        """Open the store (again, after :meth:`close`): registrations and the entry count
        are read from it. No-op when it is open."""
        if self._db is not None:
            return
        rocks = _rocksdict()
        self.path.mkdir(parents=True, exist_ok=True)
        options, self._write_options = _options(rocks)
        self._batch_type = rocks.WriteBatch
        self._read_options_type = rocks.ReadOptions
        self._db = rocks.Rdict(str(self.path), options)
        self._states: dict[str, _State] = {}
        self._metas: dict[str, StateMeta] = {}
        # (key group, state) -> (key prefix, storage kind): built once per pair.
        self._prefixes: dict[tuple[int, str], tuple[bytes, int]] = {}
        # Whether stored keys exist, as last read or written here (this table is the only
        # writer of its store): a write of a key read just before (value.update after
        # value(), a bulk set after a bulk get) needs no second lookup to keep count.
        self._seen: dict[bytes, bool] = {}
        for _, value in self._scan(_META):
            meta = StateMeta.from_bytes(value[2:])
            self._add_state(meta, value[:2])
        stored = self._db.get(_COUNT)
        self._count = (_COUNT_FORMAT.unpack(stored)[0] if stored is not None
                       else self._recount())
        epoch = self._db.get(_EPOCH)
        self._epoch = _COUNT_FORMAT.unpack(epoch)[0] if epoch is not None else 0
        self._mark = _CHANGED + _COUNT_FORMAT.pack(self._epoch)
        if self._tracking:
            if not self._count and not self._states:  # every change from here on is marked
                self._db.put(_TRACKED, b"", self._write_options)
        elif self._db.get(_TRACKED) is not None:
            self._db.delete(_TRACKED, self._write_options)  # changes go unmarked now

    # -- registrations -------------------------------------------------------------------

    @property
    def metas(self) -> Mapping[str, StateMeta]:
        """Registered states by name."""
        return self._metas

    def register(self, meta: StateMeta) -> None:
        """Register a state (stored with the data); a different kind or serializer under the
        same name is refused."""
        known = self._metas.get(meta.state)
        if known is None:
            if len(self._states) >= 0xFFFF:
                raise StateMismatchError(f"too many states to register {meta.state!r}")
            sid = len(self._states).to_bytes(2, "big")
            self._live().put(_META + meta.state.encode(), sid + meta.to_bytes(),
                             self._write_options)
            self._add_state(meta, sid)
        elif known != meta:
            raise StateMismatchError(
                f"state {meta.state!r} is registered as {describe_meta(known)} but "
                f"{describe_meta(meta)} was requested")

    def _add_state(self, meta: StateMeta, sid: bytes) -> None:
        self._states[meta.state] = _State(meta, sid)
        self._metas[meta.state] = meta

    # -- mutations -----------------------------------------------------------------------

    def _prefix(self, key_group: int, state: str) -> tuple[bytes, int]:
        found = self._prefixes.get((key_group, state))
        if found is None:
            info = self._states.get(state)
            if info is None:
                raise StateMismatchError(
                    f"change for unregistered state {state!r} in key group {key_group}")
            found = self._prefixes[(key_group, state)] = (
                _key_group_prefix(key_group) + info.sid, info.kind)
        return found

    def _exists(self, db: Any, key: bytes) -> bool:
        found = self._seen.get(key)
        if found is None:
            return db.get(key) is not None
        return found

    def _saw(self, key: bytes, found: bool) -> None:
        seen = self._seen
        if len(seen) >= _SEEN_LIMIT:
            seen.clear()  # a bound on memory: only lookups are lost
        seen[key] = found

    def _saw_all(self, found: dict[bytes, bool]) -> None:
        seen = self._seen
        if len(seen) + len(found) > _SEEN_LIMIT:
            seen.clear()
        if len(found) <= _SEEN_LIMIT:
            seen.update(found)

    def apply(self, key_group: int, op: StateOp) -> None:
        """Apply one logged mutation (an op of another state kind is refused)."""
        db = self._db if self._db is not None else self._live()
        # The cache lookup inline: this runs for every change, logged or replayed.
        found = self._prefixes.get((key_group, op.state))
        prefix, kind = found if found is not None else self._prefix(key_group, op.state)
        write = self._write_options
        op_kind = op.op
        if self._tracking:
            db.put(self._mark + prefix + op.key, b"", write)
        if kind == _KIND_MAP:
            self._apply_map(db, prefix, op)
            return
        key = prefix + op.key
        if op_kind is DELETE:
            if self._exists(db, key):
                db.delete(key, write)
                self._count -= 1
            self._saw(key, False)
            return
        if kind == _KIND_VALUE and op_kind is SET:
            assert op.value is not None
            if not self._exists(db, key):
                self._count += 1
            db.put(key, op.value, write)
        elif kind == _KIND_LIST and op_kind is LIST_ADD:
            assert op.values is not None
            current = db.get(key)
            if current is None:
                self._count += 1
                db.put(key, _encode_items(op.values), write)
            else:
                db.put(key, current + _encode_items(op.values), write)
        elif kind == _KIND_LIST and op_kind is LIST_REPLACE:
            assert op.values is not None
            existed = self._exists(db, key)
            if op.values:
                db.put(key, _encode_items(op.values), write)
                self._count += not existed
            else:
                if existed:
                    db.delete(key, write)
                self._count -= existed
                self._saw(key, False)
                return
        else:
            raise self._wrong_kind(key_group, op)
        self._saw(key, True)

    def apply_batch(self, ops: Sequence[tuple[int, StateOp]]) -> None:
        """Apply (key group, op) pairs in order, as :meth:`apply` would: the stored values of
        every key a value or list op touches are read with one multi-get (sorted: RocksDB
        reads neighbouring keys together), the writes go into one write batch with the
        ``MAP_PUT`` entries (whether the key has a map yet is looked up once per key), and
        other map ops run one by one (after the writes before them)."""
        db = self._live()
        planned: list[tuple[int, StateOp, bytes | None, int, bytes]] = []
        failure: BaseException | None = None
        for key_group, op in ops:
            try:
                found = self._prefixes.get((key_group, op.state))
                prefix, kind = found if found is not None else self._prefix(key_group,
                                                                           op.state)
            except StateMismatchError as exc:
                failure = exc  # the ops before it still apply
                break
            planned.append((key_group, op, None if kind == _KIND_MAP else prefix + op.key,
                            kind, prefix))
        keys = sorted({key for _, _, key, _, _ in planned if key is not None})
        current: dict[bytes, bytes | None] = dict(zip(keys, db.get(keys), strict=True)
                                                  ) if keys else {}
        batch = self._batch_type(raw_mode=True)
        write = self._write_options
        tracking, mark = self._tracking, self._mark
        self._seen.clear()
        # Keys known to have a map entry: the committed ones looked up, and those this
        # batch put one for (the batch holds no other map writes: see below).
        has_map: dict[bytes, bool] = {}
        try:
            for key_group, op, key, kind, prefix in planned:
                if key is None:
                    if op.op is MAP_PUT:
                        assert op.map_key is not None and op.value is not None
                        start = _map_start(prefix, op.key)
                        known = has_map.get(start)
                        if known is None:
                            known = self._any(db, start)
                        if not known:
                            self._count += 1  # the key's first map entry
                        has_map[start] = True
                        if tracking:
                            batch.put(mark + prefix + op.key, b"")
                        entry = start + op.map_key
                        batch.put(entry, op.value)
                        self._saw(entry, True)  # a later removal must not skip it
                        continue
                    if len(batch):
                        db.write(batch, write)
                        batch = self._batch_type(raw_mode=True)
                    has_map.clear()  # a removal may have emptied a map
                    self.apply(key_group, op)
                    continue
                stored = current[key]
                op_kind = op.op
                if tracking:
                    batch.put(mark + key, b"")
                if op_kind is DELETE:
                    if stored is not None:
                        batch.delete(key)
                        self._count -= 1
                        current[key] = None
                elif kind == _KIND_VALUE and op_kind is SET:
                    assert op.value is not None
                    self._count += stored is None
                    batch.put(key, op.value)
                    current[key] = op.value
                elif kind == _KIND_LIST and op_kind is LIST_ADD:
                    assert op.values is not None
                    added = _encode_items(op.values)
                    if stored is None:
                        self._count += 1
                        current[key] = added
                    else:
                        current[key] = stored + added
                    batch.put(key, current[key])
                elif kind == _KIND_LIST and op_kind is LIST_REPLACE:
                    assert op.values is not None
                    if op.values:
                        self._count += stored is None
                        current[key] = _encode_items(op.values)
                        batch.put(key, current[key])
                    elif stored is not None:
                        self._count -= 1
                        current[key] = None
                        batch.delete(key)
                else:
                    raise self._wrong_kind(key_group, op)
        finally:
            if len(batch):
                db.write(batch, write)
        if failure is not None:
            raise failure

    def apply_columns(
        self, state: str, op: OpKind, key_groups: Sequence[int], keys: Sequence[bytes],
        map_keys: Sequence[bytes | None] | None = None,
        values: Sequence[bytes | None] | None = None,
        items: Sequence[tuple[bytes, ...] | None] | None = None,
    ) -> None:
        """Apply many mutations of one state and kind, in order (the same as :meth:`apply`
        of each). ``SET``, ``LIST_REPLACE`` and ``MAP_PUT`` go into write batches (each
        key is looked up once to keep the entry count); other ops are applied one by
        one."""
        info = self._states.get(state)
        if info is None:
            raise StateMismatchError(f"changes for unregistered state {state!r}")
        if op is SET and info.kind == _KIND_VALUE and values is not None:
            self._write_columns(state, key_groups, keys, values, None)
        elif op is LIST_REPLACE and info.kind == _KIND_LIST and items is not None:
            self._write_columns(state, key_groups, keys, None, items)
        elif op is MAP_PUT and info.kind == _KIND_MAP and map_keys is not None \
                and values is not None:
            self._put_map_columns(state, key_groups, keys, map_keys, values)
        else:
            apply = self.apply
            for key_group, state_op in zip(
                    key_groups, ops_of_columns(state, op, keys, map_keys, values, items),
                    strict=True):
                apply(key_group, state_op)

    def _column_prefixes(self, state: str, key_groups: Sequence[int]) -> list[bytes]:
        found = {kg: self._prefix(kg, state)[0] for kg in set(key_groups)}
        return [found[kg] for kg in key_groups]

    @contextlib.contextmanager
    def _column_writes(self) -> Iterator[tuple[_BoundedBatch, dict[bytes, bool]]]:
        """A bounded write batch and what a column write puts in it (stored key -> present
        afterwards): written at the end and remembered as seen; on an error, what was
        written is not known, so nothing is remembered."""
        batch = _BoundedBatch(self._live(), self._batch_type, self._write_options)
        written: dict[bytes, bool] = {}
        try:
            yield batch, written
            batch.finish()
        except BaseException:
            self._seen.clear()
            raise
        self._saw_all(written)

    def _write_columns(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes],
                       values: Sequence[bytes | None] | None,
                       items: Sequence[tuple[bytes, ...] | None] | None) -> None:
        """``SET`` of ``values`` or ``LIST_REPLACE`` of ``items``, in write batches."""
        db = self._live()
        column = values if values is not None else items
        assert column is not None
        # ``written``: stored keys this call wrote (present or deleted), which the store
        # may not see yet.
        tracking, mark = self._tracking, self._mark
        with self._column_writes() as (batch, written):
            for prefix, key, data in zip(self._column_prefixes(state, key_groups), keys,
                                         column, strict=True):
                stored = prefix + key
                if tracking:
                    batch.put(mark + stored, b"")
                existed = written.get(stored)
                if existed is None:
                    existed = self._exists(db, stored)
                assert data is not None
                if values is None and not data:  # LIST_REPLACE with nothing: removed
                    if existed:
                        batch.delete(stored)
                        self._count -= 1
                    written[stored] = False
                else:
                    batch.put(stored, data if values is not None
                              else _encode_items(data))  # type: ignore[arg-type]
                    self._count += not existed
                    written[stored] = True

    def _put_map_columns(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes],
                         map_keys: Sequence[bytes | None], values: Sequence[bytes | None]
                         ) -> None:
        """``MAP_PUT`` of many map entries, in write batches."""
        db = self._live()
        filled: set[bytes] = set()  # keys (their entry prefix) whose map has an entry
        tracking, mark = self._tracking, self._mark
        with self._column_writes() as (batch, written):
            for prefix, key, map_key, value in zip(
                    self._column_prefixes(state, key_groups), keys, map_keys, values,
                    strict=True):
                assert map_key is not None and value is not None
                if tracking:
                    batch.put(mark + prefix + key, b"")
                start = _map_start(prefix, key)
                stored = start + map_key
                if (stored not in written and start not in filled
                        and not self._exists(db, stored) and not self._any(db, start)):
                    self._count += 1  # the key's first map entry
                written[stored] = True
                filled.add(start)
                batch.put(stored, value)

    def _apply_map(self, db: Any, prefix: bytes, op: StateOp) -> None:
        start = _map_start(prefix, op.key)
        op_kind = op.op
        if op_kind is MAP_PUT:
            assert op.map_key is not None and op.value is not None
            key = start + op.map_key
            if not self._exists(db, key) and not self._any(db, start):
                self._count += 1  # the key's first map entry
            db.put(key, op.value, self._write_options)
            self._saw(key, True)
        elif op_kind is MAP_REMOVE:
            assert op.map_key is not None
            key = start + op.map_key
            if self._exists(db, key):
                db.delete(key, self._write_options)
                if not self._any(db, start):
                    self._count -= 1  # the key's last map entry
            self._saw(key, False)
        elif op_kind is DELETE:
            batch = self._batch_type(raw_mode=True)
            for key, _ in self._scan(start):
                batch.delete(key)
                self._seen.pop(key, None)
            if len(batch):
                db.write(batch, self._write_options)
                self._count -= 1
        else:
            raise StateMismatchError(
                f"{op_kind.value} on map state {op.state!r} (only MAP_PUT, MAP_REMOVE and "
                "DELETE apply to a map state)")

    def _wrong_kind(self, key_group: int, op: StateOp) -> StateMismatchError:
        meta = self._metas[op.state]
        return StateMismatchError(
            f"{op.op.value} on {meta.kind.value} state {op.state!r} in key group {key_group}")

    # -- reads -----------------------------------------------------------------------------

    def get(self, key_group: int, state: str, key: bytes) -> Entry | None:
        """The entry of ``key`` (None if absent)."""
        db = self._db if self._db is not None else self._live()
        found = self._prefixes.get((key_group, state))
        if found is None:
            if state not in self._states:
                return None
            found = self._prefix(key_group, state)
        prefix, kind = found
        if kind == _KIND_MAP:
            start = _map_start(prefix, key)
            cut = len(start)
            items = {k[cut:]: v for k, v in self._scan(start)}
            return items or None
        stored_key = prefix + key
        data = db.get(stored_key)
        self._saw(stored_key, data is not None)
        if data is None or kind == _KIND_VALUE:
            return data  # type: ignore[no-any-return]
        return _decode_items(data)

    def get_map_value(self, key_group: int, state: str, key: bytes,
                      map_key: bytes) -> bytes | None:
        """One value of a map entry (None if absent): one RocksDB point read."""
        db = self._db if self._db is not None else self._live()
        found = self._prefixes.get((key_group, state))
        if found is None:
            if state not in self._states:
                return None
            found = self._prefix(key_group, state)
        prefix, kind = found
        if kind != _KIND_MAP:
            return None
        stored_key = _map_start(prefix, key) + map_key
        data = db.get(stored_key)
        self._saw(stored_key, data is not None)
        return data  # type: ignore[no-any-return]

    def key_groups(self) -> list[int]:
        """Key groups holding at least one entry, ascending (one seek per key group)."""
        found = []
        iterator = self._live().iter()
        iterator.seek_to_first()
        while iterator.valid():
            key = iterator.key()
            if key >= _RESERVED:
                break
            key_group = int.from_bytes(key[:2], "big")
            found.append(key_group)
            iterator.seek(_key_group_prefix(key_group + 1))
        return found

    def has_entries(self, key_group: int) -> bool:
        """Whether ``key_group`` holds at least one entry."""
        return self._any(self._live(), _key_group_prefix(key_group))

    def entries(self, key_group: int) -> Iterator[tuple[str, bytes, Entry]]:
        """(state, key, entry) of the key group, ordered by state name then key (a map
        ordered by map key)."""
        for name in sorted(self._states):
            yield from self._state_entries(key_group, name)

    def state_entries(self, key_group: int, state: str) -> Iterator[tuple[bytes, Entry]]:
        """(key, entry) of one state in the key group, ordered by key (one prefix scan)."""
        if state in self._states:
            for _, key, entry in self._state_entries(key_group, state):
                yield key, entry

    def _state_entries(self, key_group: int, name: str) -> Iterator[tuple[str, bytes, Entry]]:
        prefix, kind = self._prefix(key_group, name)
        cut = len(prefix)
        if kind == _KIND_VALUE:
            for key, value in self._scan(prefix):
                yield name, key[cut:], value
        elif kind == _KIND_LIST:
            for key, value in self._scan(prefix):
                yield name, key[cut:], _decode_items(value)
        else:
            current: bytes | None = None
            entry: dict[bytes, bytes] = {}
            for key, value in self._scan(prefix):
                end = key.find(_KEY_END, cut)
                escaped = key[cut:end]
                if escaped != current:
                    if current is not None:
                        yield name, current.replace(_ESCAPED_NUL, _NUL), entry
                    current, entry = escaped, {}
                entry[key[end + 2:]] = value
            if current is not None:
                yield name, current.replace(_ESCAPED_NUL, _NUL), entry

    def entry_count(self) -> int:
        """Entries in all (a key of a state; a list or a map counts once); kept as they
        change, not counted."""
        return self._count

    # -- snapshots of a key group -----------------------------------------------------------

    def serialize_group(self, key_group: int) -> bytes:
        """The key group's state (``schemas/key_group_state.avsc``): the same bytes as the
        in-memory table's for the same state, encoded as the store is iterated (a value
        state's entries straight from the iterator)."""
        tables = []
        for name in sorted(self._states):
            prefix, kind = self._prefix(key_group, name)
            if kind == _KIND_VALUE:
                body, count = encode_value_entries(self._scan(prefix), len(prefix))
            else:
                body, count = encode_entries(
                    (key, entry) for _, key, entry in self._state_entries(key_group, name))
            tables.append((self._metas[name], body, count))
        return assemble_key_group(tables)

    def load_group(self, key_group: int, data: bytes) -> None:
        """Replace the key group's state with a serialized one: entries go from the decoded
        bytes straight into a write batch (written every ``_LOAD_BATCH`` entries), no
        table object per key."""
        db = self._live()
        group = _key_group_prefix(key_group)
        batch = self._batch_type(raw_mode=True)
        if self._any(db, group):
            self._count -= sum(1 for _ in self.entries(key_group))
            batch.delete_range(group, _key_group_prefix(key_group + 1))
        self._seen.clear()
        write = self._write_options
        # The state being loaded: ``tick`` points its ``put`` at the next batch.
        loading: list[StateLoad] = []

        def state(meta: StateMeta) -> StateLoad:
            self.register(meta)
            prefix, kind = self._prefix(key_group, meta.state)

            def start_of(key: bytes) -> bytes:
                return _map_start(prefix, key)

            def other(key: bytes, value: bytes | None, values: list[bytes] | None,
                      items: list[tuple[bytes, bytes]] | None) -> int:
                # An entry of an unusual shape: the entry of the state's kind if present.
                put = load.put
                if kind == _KIND_VALUE and value is not None:
                    put(prefix + key, value)
                elif kind == _KIND_LIST and values is not None:
                    put(prefix + key, _encode_items(values))
                elif kind == _KIND_MAP and items is not None:
                    if not items:
                        return 0  # an empty map is no entry
                    start = start_of(key)
                    for map_key, item in items:
                        put(start + map_key, item)
                elif value is None and values is None and items is None:
                    return 0  # an entry without data
                else:
                    raise StateMismatchError(
                        f"snapshot of key group {key_group} holds an entry of another kind "
                        f"for {meta.kind.value} state {meta.state!r}")
                return 1

            if kind == _KIND_MAP:
                load = StateLoad(SHAPE_MAP, prefix, batch.put, other, map_start=start_of)
            elif kind == _KIND_LIST:
                load = StateLoad(SHAPE_LIST, prefix, batch.put, other,
                                 list_value=_encode_items)
            else:
                load = StateLoad(SHAPE_VALUE, prefix, batch.put, other)
            loading[:] = [load]
            return load

        def tick() -> None:
            nonlocal batch
            if len(batch) >= _LOAD_BATCH:
                db.write(batch, write)  # a written batch cannot be reused
                batch = self._batch_type(raw_mode=True)
                for load in loading:
                    load.put = batch.put

        self._count += load_key_group(data, state, tick)
        if len(batch):
            db.write(batch, write)

    # -- changed keys (``track_changes``) ---------------------------------------------------

    @property
    def changes_complete(self) -> bool:
        """Whether every mutation since the store was empty was tracked: only then do
        :meth:`changed_keys` name every key changed since the marks were last cleared."""
        return self._live().get(_TRACKED) is not None

    def changed_keys(self, key_group: int) -> Iterator[tuple[str, bytes]]:
        """(state, key) of every key of ``key_group`` a mutation touched in a change epoch
        not yet forgotten (:meth:`clear_changes`), by state number and key; a key touched
        in several epochs once."""
        for found, keys in self.changed_keys_by_group():
            if found == key_group:
                yield from keys

    def changed_keys_by_group(self) -> Iterator[tuple[int, list[tuple[str, bytes]]]]:
        """(key group, its :meth:`changed_keys`) for every key group with marks,
        ascending: one pass over each epoch's marks, one key group's in memory at a time."""
        names = {info.sid: name for name, info in self._states.items()}
        cut = len(_CHANGED) + 8
        epochs = []
        for epoch in self._marked_epochs():
            prefix = _CHANGED + _COUNT_FORMAT.pack(epoch)
            epochs.append(((int.from_bytes(k[cut:cut + 2], "big"), k[cut + 2:])
                           for k, _ in self._scan(prefix)))
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
        iterator = self._live().iter()
        iterator.seek(_CHANGED)
        while iterator.valid():
            key = iterator.key()
            if not key.startswith(_CHANGED):
                break
            epoch = _COUNT_FORMAT.unpack(key[len(_CHANGED):len(_CHANGED) + 8])[0]
            epochs.append(epoch)
            iterator.seek(_CHANGED + _COUNT_FORMAT.pack(epoch + 1))
        return epochs

    def start_change_epoch(self) -> int:
        """End the current change epoch (returned): keys touched from now on are marked
        with the next one, so :meth:`clear_changes` of this one keeps their marks."""
        ended = self._epoch
        self._epoch += 1
        self._mark = _CHANGED + _COUNT_FORMAT.pack(self._epoch)
        self._live().put(_EPOCH, _COUNT_FORMAT.pack(self._epoch), self._write_options)
        return ended

    def clear_changes(self, upto: int) -> None:
        """Forget the keys marked in change epochs up to ``upto`` (their changes are in a
        snapshot now): one range deletion."""
        batch = self._batch_type(raw_mode=True)
        batch.delete_range(_CHANGED, _CHANGED + _COUNT_FORMAT.pack(upto + 1))
        self._live().write(batch, self._write_options)

    # -- the store -------------------------------------------------------------------------

    def flush(self) -> None:
        """Make the store durable as it is now (memtables to files, synced): after this,
        reopening the directory gives exactly this state."""
        db = self._live()
        db.put(_COUNT, _COUNT_FORMAT.pack(self._count), self._write_options)
        db.flush(True)

    def copy_to(self, path: str | Path) -> None:
        """Write a copy of the store as of its last :meth:`flush` into the new directory
        ``path`` (a RocksDB checkpoint: the files are hard links where the file system
        allows), which opens as a table of that state. Call :meth:`flush` first: writes
        skip the write-ahead log, so only flushed ones are sure to be in the copy (a
        second flush here would write one more file per copy)."""
        _rocksdict().Checkpoint(self._live()).create_checkpoint(str(path))

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._db is None

    def close(self) -> None:
        """Close the store: its state stays on disk for :meth:`reopen` or another process
        (with ``remove_on_close``, the directory is deleted instead). Idempotent."""
        db = self._db
        if db is None:
            return
        self._db = None
        try:
            if not self._remove_on_close:
                db.put(_COUNT, _COUNT_FORMAT.pack(self._count), self._write_options)
            db.close()
        finally:
            if self._remove_on_close:
                shutil.rmtree(self.path, ignore_errors=True)

    # -- mechanics -----------------------------------------------------------------------

    def _live(self) -> Any:
        db = self._db
        if db is None:
            raise ValueError(f"the RocksDB state table at {self.path} is closed")
        return db

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of every stored key starting with ``prefix``, in key order (the
        iterator is bounded above: RocksDB stops at the prefix's end)."""
        db = self._live()
        end = _prefix_end(prefix)
        if end is None:
            yield from db.items(from_key=prefix)
            return
        # rocksdict's iterator reads the bound from these options: they must outlive it,
        # which this generator's frame sees to.
        bounded = self._read_options_type()
        bounded.set_iterate_upper_bound(end)
        yield from db.items(from_key=prefix, read_opt=bounded)

    @staticmethod
    def _any(db: Any, prefix: bytes) -> bool:
        iterator = db.iter()
        iterator.seek(prefix)
        return bool(iterator.valid() and iterator.key().startswith(prefix))

    def _recount(self) -> int:
        return sum(1 for kg in self.key_groups() for _ in self.entries(kg))

    def __repr__(self) -> str:
        return f"RocksDBStateTable({str(self.path)!r}{', closed' if self.closed else ''})"


__all__ = ["RocksDBStateTable"]
