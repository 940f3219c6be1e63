"""A keyed state table in RocksDB (``rocksdict``, the binding Quix Streams uses).

One RocksDB per store directory holds the entries of a backend's key groups, so state
larger than memory fits and a store on local disk outlives the process (streaming
reattaches it: see :mod:`kafka_changelog.state.host.local_store`). The changelog in Kafka
stays the durable log; this is only the working copy.

The table is put together from modules of its own: the key layout
(:mod:`~kafka_changelog.state.rocksdb.keys`), what each op does to the store, written
once for the single, batched and columnar paths
(:mod:`~kafka_changelog.state.rocksdb.mutation`), the changed-key marks of incremental
materializations (:mod:`~kafka_changelog.state.rocksdb.changes`) and RocksDB's settings
(:mod:`~kafka_changelog.state.rocksdb.options`). Iterating a state's prefix gives its
entries ordered by key and map key, which is the order of
:meth:`RocksDBStateTable.serialize_group`: it writes exactly the bytes of the in-memory
table's for the same state, so snapshots are interchangeable.

Writes skip RocksDB's write-ahead log: the Kafka changelog is the durable log, and a
store is only trusted again (:meth:`RocksDBStateTable.flush`, then a manifest written
by the caller) after it was flushed to disk whole.

``rocksdict`` is imported when a table is opened, not with this module: without it,
opening raises :class:`~kafka_changelog.state.errors.StateBackendUnavailableError`.

Over the library's 600 lines because it is one class, the whole
:class:`~kafka_changelog.state.tables.protocol.KeyedStateTable` protocol on one store
(registrations, the three mutation entry points, reads, key group snapshots, changed
keys, the store's life); what can stand alone is in the modules above.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import StateBackendUnavailableError, StateMismatchError
from ..schema.descriptors import StateKind
from ..schema.evolution import merge_metas
from ..schema.key_group_codec import (
    SHAPE_LIST,
    SHAPE_MAP,
    SHAPE_VALUE,
    StateLoad,
    assemble_key_group,
    encode_entries,
    encode_value_entries,
    load_key_group,
)
from ..schema.op_run import OpRun
from ..schema.ops import OpKind, StateMeta, StateOp
from ..tables.protocol import Entry
from .changes import ChangeTracker
from .group_writes import GroupWrites
from .ingest import SstIngest
from .keys import (
    COUNT,
    INT64,
    META,
    RESERVED,
    decode_items,
    encode_items,
    key_group_prefix,
    map_start,
    prefix_end,
    split_map_key,
    state_prefix,
    unescape,
)
from .mutation import (
    ALLOWED,
    BATCH_LIMIT,
    KIND_LIST,
    KIND_MAP,
    KIND_VALUE,
    BatchedWrites,
    DirectWrites,
    SeenKeys,
    any_under,
    mutate,
    mutate_columns,
)
from .options import RocksDBOptions


def _rocksdict() -> Any:
    """The ``rocksdict`` module, or a clear error naming the package to install."""
    try:
        import rocksdict
    except ImportError as exc:
        raise StateBackendUnavailableError(
            "the RocksDB state backend needs the 'rocksdict' package: pip install rocksdict "
            "(or pip install 'kafka-changelog[rocksdb]')") from exc
    return rocksdict


class _State:
    """A registered state: its meta, key prefix number and storage kind."""

    __slots__ = ("kind", "meta", "sid")

    def __init__(self, meta: StateMeta, sid: bytes) -> None:
        self.meta = meta
        self.sid = sid
        self.kind = (KIND_MAP if meta.kind is StateKind.MAP
                     else KIND_LIST if meta.kind is StateKind.LIST else KIND_VALUE)


class RocksDBStateTable:
    """Keyed state in one RocksDB at ``path`` (created if missing, reopened if present).

    Implements :class:`~kafka_changelog.state.tables.protocol.KeyedStateTable`. One
    operator thread uses it, like the in-memory table. ``remove_on_close`` deletes the
    directory in :meth:`close` (a working copy nobody reattaches).
    """

    def __init__(self, path: str | Path, *, remove_on_close: bool = False,
                 track_changes: bool = False, options: RocksDBOptions | None = None
                 ) -> None:
        """``track_changes``: remember which keys mutations touched, by change epoch (see
        :meth:`changed_keys`), for incremental materializations. ``options``: RocksDB's
        settings (None: the defaults of :class:`RocksDBOptions`)."""
        if options is not None and not isinstance(options, RocksDBOptions):
            raise TypeError(f"options must be RocksDBOptions, got {type(options).__name__}")
        self.path = Path(path)
        #: RocksDB's settings of this table.
        self.options = options if options is not None else RocksDBOptions()
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
        self._options, self._write_options = self.options.open_options(rocks)
        self._batch_type = rocks.WriteBatch
        self._read_options_type = rocks.ReadOptions
        self._db = db = rocks.Rdict(str(self.path), self._options)
        self._states: dict[str, _State] = {}
        self._metas: dict[str, StateMeta] = {}
        # (key group, state) -> (key prefix, storage kind): built once per pair.
        self._prefixes: dict[tuple[int, str], tuple[bytes, int]] = {}
        self._seen = SeenKeys()
        self._counting = True
        for _, value in self._scan(META):
            meta = StateMeta.from_bytes(value[2:])
            self._add_state(meta, value[:2])
        stored = db.get(COUNT)
        self._count = INT64.unpack(stored)[0] if stored is not None else self._recount()
        self._changes = ChangeTracker(db, self._write_options, self._batch_type, self._scan,
                                      tracking=self._tracking,
                                      empty=not self._count and not self._states)
        self._direct = DirectWrites(db, self._write_options, self._batch_type, self._seen,
                                    self._scan, self._changes.mark)

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
            self._live().put(META + meta.state.encode(), sid + meta.to_bytes(),
                             self._write_options)
            self._add_state(meta, sid)
        elif known != meta:
            merged = merge_metas(known, meta)
            if merged != known:  # more Avro writer schemas: the same state id
                sid = self._states[meta.state].sid
                self._live().put(META + meta.state.encode(), sid + merged.to_bytes(),
                                 self._write_options)
                self._add_state(merged, sid)

    def _add_state(self, meta: StateMeta, sid: bytes) -> None:
        self._states[meta.state] = _State(meta, sid)
        self._metas[meta.state] = meta

    # -- mutations -----------------------------------------------------------------------
    # Every path plans an op's effect with rocksdb_mutation.mutate; they differ only in
    # how they read the store and write to it (straight, or in write batches).

    def _prefix(self, key_group: int, state: str) -> tuple[bytes, int]:
        found = self._prefixes.get((key_group, state))
        if found is None:
            info = self._states.get(state)
            if info is None:
                raise StateMismatchError(
                    f"change for unregistered state {state!r} in key group {key_group}")
            found = self._prefixes[(key_group, state)] = (
                state_prefix(key_group, info.sid), info.kind)
        return found

    def apply(self, key_group: int, op: StateOp) -> None:
        """Apply one logged mutation, straight to the store (an op of another state kind
        is refused, with nothing written)."""
        if self._db is None:
            self._live()
        # The cache lookup inline: this runs for every change, logged or replayed.
        found = self._prefixes.get((key_group, op.state))
        prefix, kind = found if found is not None else self._prefix(key_group, op.state)
        op_kind = op.op
        if op_kind not in ALLOWED[kind]:
            raise self._refused(key_group, op.state, op_kind)
        self._count += mutate(self._direct, kind, op_kind, prefix, op.key, op.map_key,
                              op.value, op.values)

    def apply_batch(self, ops: Sequence[tuple[int, StateOp]]) -> None:
        """Apply (key group, op) pairs in order, as :meth:`apply` of each would: the
        stored values of the value and list keys are read with one multi-get, the writes
        go into write batches (one per :data:`~.rocksdb_mutation.BATCH_LIMIT` changes,
        and before a map op reads a map this batch wrote to). An op refused (another
        kind, an unregistered state) raises after the ops before it were applied."""
        writes = self._batched()
        planned: list[tuple[int, StateOp, bytes, int]] = []
        failure: BaseException | None = None
        for key_group, op in ops:
            try:
                found = self._prefixes.get((key_group, op.state))
                prefix, kind = found if found is not None else self._prefix(key_group,
                                                                           op.state)
                if op.op not in ALLOWED[kind]:
                    raise self._refused(key_group, op.state, op.op)
            except StateMismatchError as exc:
                failure = exc  # the ops before it still apply
                break
            planned.append((key_group, op, prefix, kind))
        # A replay's ops mostly touch keys not read before: one multi-get of them all
        # costs less than asking SeenKeys first (forgotten at the end instead).
        writes.prefetch([prefix + op.key for _, op, prefix, kind in planned
                         if kind != KIND_MAP])
        try:
            for _, op, prefix, kind in planned:
                self._count += mutate(writes, kind, op.op, prefix, op.key, op.map_key,
                                      op.value, op.values)
        finally:
            writes.finish(remember=False)
        if failure is not None:
            raise failure

    def apply_columns(
        self, state: str, op: OpKind, key_groups: Sequence[int], keys: Sequence[bytes],
        map_keys: Sequence[bytes | None] | None = None,
        values: Sequence[bytes | None] | None = None,
        items: Sequence[tuple[bytes, ...] | None] | None = None,
    ) -> None:
        """Apply many mutations of one state and kind, in order, as :meth:`apply` of
        each would (op ``i`` is ``StateOp(state, op, keys[i], map_keys[i], values[i],
        items[i])`` in key group ``key_groups[i]``; a column that is None is None for
        all): in write batches, the keys not known to exist read with one multi-get,
        no op object built."""
        info = self._states.get(state)
        if info is None:
            raise StateMismatchError(f"changes for unregistered state {state!r}")
        if not keys:
            return
        kind = info.kind
        if op not in ALLOWED[kind]:
            raise self._refused(key_groups[0], state, op)
        writes = self._batched()
        try:
            self._count += mutate_columns(writes, kind, op,
                                          self._column_prefixes(state, key_groups), keys,
                                          map_keys, values, items)
        finally:
            writes.finish()

    def _column_prefixes(self, state: str, key_groups: Sequence[int]) -> list[bytes]:
        found = {kg: self._prefix(kg, state)[0] for kg in set(key_groups)}
        return [found[kg] for kg in key_groups]

    def _batched(self) -> BatchedWrites:
        return BatchedWrites(self._live(), self._write_options, self._batch_type, self._seen,
                             self._scan, self._changes.mark, self._counting)

    @contextmanager
    def recounted(self, entry_count: int) -> Iterator[None]:
        """Within the block, bulk writes (:meth:`apply_columns`) of value states do not read
        whether each key existed; after it, the entry count is ``entry_count``: the count
        of the state the block leads to, known beforehand (a checkpoint's,
        :attr:`~kafka_changelog.state.checkpoints.checkpoint.KeyedStateHandle.entry_count`,
        for a catch-up to it). If the block raises, the count is taken from the store
        (every entry read)."""
        if not self._counting:
            raise RuntimeError(f"{self!r} is already applying ops without counting them")
        self._counting = False
        try:
            yield
        except BaseException:
            self._counting = True
            if self._db is not None:
                self._count = self._recount()
            raise
        self._counting = True
        self._count = entry_count

    def _refused(self, key_group: int, state: str, op: OpKind) -> StateMismatchError:
        kind = self._metas[state].kind
        if kind is StateKind.MAP:
            return StateMismatchError(
                f"{op.value} on map state {state!r} (only MAP_PUT, MAP_REMOVE and DELETE "
                "apply to a map state)")
        return StateMismatchError(
            f"{op.value} on {kind.value} state {state!r} in key group {key_group}")

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
        if kind == KIND_MAP:
            start = map_start(prefix, key)
            cut = len(start)
            items = {k[cut:]: v for k, v in self._scan(start)}
            return items or None
        stored_key = prefix + key
        data = db.get(stored_key)
        self._seen.saw(stored_key, data is not None)
        if data is None or kind == KIND_VALUE:
            return data  # type: ignore[no-any-return]
        return decode_items(data)

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
        if kind != KIND_MAP:
            return None
        stored_key = map_start(prefix, key) + map_key
        data = db.get(stored_key)
        self._seen.saw(stored_key, data is not None)
        return data  # type: ignore[no-any-return]

    def get_map_values(self, key_groups: Sequence[int], state: str, keys: Sequence[bytes],
                       map_keys: Sequence[bytes]) -> list[bytes | None]:
        """:meth:`get_map_value` of each, with one multi-get in key order."""
        db = self._db if self._db is not None else self._live()
        info = self._states.get(state)
        if info is None or info.kind != KIND_MAP:
            return [None] * len(keys)
        prefixes = self._column_prefixes(state, key_groups)
        stored = [map_start(prefix, key) + map_key for prefix, key, map_key
                  in zip(prefixes, keys, map_keys, strict=True)]
        wanted = sorted(set(stored))
        found = dict(zip(wanted, db.get(wanted), strict=True)) if wanted else {}
        self._seen.saw_all({key: data is not None for key, data in found.items()})
        return [found[key] for key in stored]

    def key_groups(self) -> list[int]:
        """Key groups holding at least one entry, ascending (one seek per key group)."""
        found = []
        iterator = self._live().iter()
        iterator.seek_to_first()
        while iterator.valid():
            key = iterator.key()
            if key >= RESERVED:
                break
            key_group = int.from_bytes(key[:2], "big")
            found.append(key_group)
            iterator.seek(key_group_prefix(key_group + 1))
        return found

    def has_entries(self, key_group: int) -> bool:
        """Whether ``key_group`` holds at least one entry."""
        return any_under(self._live(), key_group_prefix(key_group))

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
        if kind == KIND_VALUE:
            for key, value in self._scan(prefix):
                yield name, key[cut:], value
        elif kind == KIND_LIST:
            for key, value in self._scan(prefix):
                yield name, key[cut:], decode_items(value)
        else:
            current: bytes | None = None
            entry: dict[bytes, bytes] = {}
            for key, value in self._scan(prefix):
                escaped, map_key = split_map_key(key, cut)
                if escaped != current:
                    if current is not None:
                        yield name, unescape(current), entry
                    current, entry = escaped, {}
                entry[map_key] = value
            if current is not None:
                yield name, unescape(current), entry

    def entry_count(self) -> int:
        """Entries in all (a key of a value or list state is one; a map counts each of
        its entries): the store's stored entry keys, kept as they change, not counted."""
        return self._count

    # -- snapshots of a key group -----------------------------------------------------------

    def serialize_group(self, key_group: int) -> bytes:
        """The key group's state (``schemas/key_group_state.avsc``): the same bytes as the
        in-memory table's for the same state, encoded as the store is iterated (a value
        state's entries straight from the iterator)."""
        tables = []
        for name in sorted(self._states):
            prefix, kind = self._prefix(key_group, name)
            if kind == KIND_VALUE:
                body, count = encode_value_entries(self._scan(prefix), len(prefix))
            else:
                body, count = encode_entries(
                    (key, entry) for _, key, entry in self._state_entries(key_group, name))
            tables.append((self._metas[name], body, count))
        return assemble_key_group(tables)

    def load_group(self, key_group: int, data: bytes) -> None:
        """Replace the key group's state with a serialized one: entries go from the decoded
        bytes straight into a write batch (written every ``BATCH_LIMIT`` entries), no
        table object per key."""
        db = self._live()
        group = key_group_prefix(key_group)
        batch = self._batch_type(raw_mode=True)
        if any_under(db, group):
            self._count -= self._stored_keys(group, key_group_prefix(key_group + 1))
            batch.delete_range(group, key_group_prefix(key_group + 1))
        self._seen.clear()
        write = self._write_options
        # The state being loaded: ``tick`` points its ``put`` at the next batch.
        loading: list[StateLoad] = []

        def state(meta: StateMeta) -> StateLoad:
            load = self._state_load(key_group, meta, batch.put)
            loading[:] = [load]
            return load

        def tick() -> None:
            nonlocal batch
            if len(batch) >= BATCH_LIMIT:
                db.write(batch, write)  # a written batch cannot be reused
                batch = self._batch_type(raw_mode=True)
                for load in loading:
                    load.put = batch.put

        self._count += load_key_group(data, state, tick)
        if len(batch):
            db.write(batch, write)

    def load_groups(self, groups: Iterable[tuple[int, bytes]],
                    tail: Mapping[int, Sequence[OpRun]] | None = None) -> None:
        """:meth:`load_group` of each (key group, serialized state) in order, then the ops
        of ``tail`` (key group -> its runs of ops in log order) as :meth:`apply` of each
        would: the same result. Into an empty store (a restore's fresh working copy), each
        key group's entries are decoded into memory, its tail ops applied to them there
        (:mod:`.group_writes`, a run of value sets or map puts in one dict update), and
        the result written as sorted SST files and ingested whole (:mod:`.ingest`): no
        memtable, no flush or compaction of them, no store read per tail op; one key
        group's entries in memory at a time. A store with entries, or a key group given
        twice: through :meth:`load_group` (an ingested file would hide entries, not
        replace them)."""
        db = self._live()
        tail = tail or {}
        if self._count or self.key_groups():
            for key_group, data in groups:
                self.load_group(key_group, data)
            for key_group in sorted(tail):
                self._apply_runs(key_group, tail[key_group])
            return
        self._seen.clear()
        ingest = SstIngest(_rocksdict(), db, self._options, self.path)
        ingested: set[int] = set()
        again: set[int] = set()  # loaded twice: its tail goes after the second load
        try:
            for key_group, data in groups:
                if key_group in ingested:
                    ingest.finish()  # then replaced as load_group replaces
                    self.load_group(key_group, data)
                    again.add(key_group)
                    continue
                ingested.add(key_group)
                self._ingest_group(ingest, key_group, data, tail.get(key_group, ()))
            for key_group in sorted(set(tail) - ingested):  # key groups only the tail has
                self._ingest_group(ingest, key_group, None, tail[key_group])
            ingest.finish()
        except BaseException:
            ingest.abandon()
            raise
        for key_group in sorted(again & set(tail)):
            self._apply_runs(key_group, tail[key_group])

    def _apply_runs(self, key_group: int, runs: Sequence[OpRun]) -> None:
        for run in runs:
            self.apply_columns(run.state, run.op, [key_group] * len(run), run.keys,
                               run.map_keys, run.values, run.items)

    def _ingest_group(self, ingest: SstIngest, key_group: int, data: bytes | None,
                      runs: Sequence[OpRun]) -> None:
        """Decode ``data`` (None: the key group has no snapshot) into a dict of stored
        entries, apply the ops of ``runs`` to it, and write it sorted: the store's key
        order, states by number (a snapshot orders them by name)."""
        entries: dict[bytes, bytes] = {}  # a later put of a key replaces it, as in a batch

        def state(meta: StateMeta) -> StateLoad:
            return self._state_load(key_group, meta, entries.__setitem__)

        count = load_key_group(data, state) if data is not None else 0
        if runs:
            writes = GroupWrites(entries, self._changes.mark)
            for run in runs:
                found = self._prefixes.get((key_group, run.state))
                prefix, kind = found if found is not None else self._prefix(key_group,
                                                                           run.state)
                if run.op not in ALLOWED[kind]:
                    raise self._refused(key_group, run.state, run.op)
                count += mutate_columns(writes, kind, run.op, [prefix] * len(run), run.keys,
                                        run.map_keys, run.values, run.items)
            if writes.marks:
                marks = self._batch_type(raw_mode=True)
                for mark in writes.marks:
                    marks.put(mark, b"")
                self._live().write(marks, self._write_options)
        keys = sorted(entries)  # bytes order: the store's
        ingest.add_group(key_group, keys, map(entries.__getitem__, keys))
        self._count += count

    def _state_load(self, key_group: int, meta: StateMeta, put: Callable[[bytes, Any], Any]
                    ) -> StateLoad:
        """How :func:`load_key_group` stores ``meta``'s entries of ``key_group`` through
        ``put(stored key, stored value)`` (registering the state)."""
        self.register(meta)
        prefix, kind = self._prefix(key_group, meta.state)

        def start_of(key: bytes) -> bytes:
            return map_start(prefix, key)

        def other(key: bytes, value: bytes | None, values: list[bytes] | None,
                  items: list[tuple[bytes, bytes]] | None) -> int:
            # An entry of an unusual shape: the entry of the state's kind if present.
            put = load.put
            if kind == KIND_VALUE and value is not None:
                put(prefix + key, value)
            elif kind == KIND_LIST and values is not None:
                put(prefix + key, encode_items(values))
            elif kind == KIND_MAP and items is not None:
                start = start_of(key)
                for map_key, item in items:
                    put(start + map_key, item)
                return len(items)  # an empty map is no entry
            elif value is None and values is None and items is None:
                return 0  # an entry without data
            else:
                raise StateMismatchError(
                    f"snapshot of key group {key_group} holds an entry of another kind "
                    f"for {meta.kind.value} state {meta.state!r}")
            return 1

        if kind == KIND_MAP:
            load = StateLoad(SHAPE_MAP, prefix, put, other, map_start=start_of)
        elif kind == KIND_LIST:
            load = StateLoad(SHAPE_LIST, prefix, put, other, list_value=encode_items)
        else:
            load = StateLoad(SHAPE_VALUE, prefix, put, other)
        return load

    # -- changed keys (``track_changes``) ---------------------------------------------------

    @property
    def changes_complete(self) -> bool:
        """Whether every mutation since the store was empty was tracked: only then do
        :meth:`changed_keys` name every key changed since the marks were last cleared."""
        self._live()
        return self._changes.complete

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
        self._live()
        names = {info.sid: name for name, info in self._states.items()}
        return self._changes.changed_keys_by_group(names)

    def start_change_epoch(self) -> int:
        """End the current change epoch (returned): keys touched from now on are marked
        with the next one, so :meth:`clear_changes` of this one keeps their marks."""
        self._live()
        ended = self._changes.start_epoch()
        self._direct.mark = self._changes.mark
        return ended

    def clear_changes(self, upto: int) -> None:
        """Forget the keys marked in change epochs up to ``upto`` (their changes are in a
        snapshot now): one range deletion."""
        self._live()
        self._changes.clear(upto)

    # -- the store -------------------------------------------------------------------------

    def flush(self) -> None:
        """Make the store durable as it is now (memtables to files, synced): after this,
        reopening the directory gives exactly this state."""
        db = self._live()
        db.put(COUNT, INT64.pack(self._count), self._write_options)
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
                db.put(COUNT, INT64.pack(self._count), self._write_options)
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
        end = prefix_end(prefix)
        if end is None:
            yield from db.items(from_key=prefix)
            return
        # rocksdict's iterator reads the bound from these options: they must outlive it,
        # which this generator's frame sees to.
        bounded = self._read_options_type()
        bounded.set_iterate_upper_bound(end)
        yield from db.items(from_key=prefix, read_opt=bounded)

    def _recount(self) -> int:
        return self._stored_keys(b"", RESERVED)

    def _stored_keys(self, start: bytes, end: bytes) -> int:
        """The stored keys from ``start`` up to ``end`` (excluded)."""
        bounded = self._read_options_type()
        bounded.set_iterate_upper_bound(end)
        return sum(1 for _ in self._live().keys(from_key=start, read_opt=bounded))

    def __repr__(self) -> str:
        return f"RocksDBStateTable({str(self.path)!r}{', closed' if self.closed else ''})"


__all__ = ["RocksDBStateTable"]
