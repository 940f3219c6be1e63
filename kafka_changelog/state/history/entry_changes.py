"""Entries written into an application's state: rows to state ops, appended to a new log.

A state write (:mod:`.state_write`) applies rows of entries to an application's latest
checkpoint. Each row names one entry of one state and what it becomes
(:class:`EntryChange`); this module turns a task's rows into the state ops a backend
would have logged for them, appends them with the states' registrations to a changelog
writer of their own (one log per task) and persists it: the handle is what the task
reports (:class:`WrittenChanges`).

What a row means, by the state's kind (anything else is refused with
:class:`StateWriteError`, naming the state, the key and the column):

- value-like states (``VALUE``, ``REDUCING``, ``AGGREGATING``): one row per key; a value
  sets it (``SET``), no value deletes the key (``DELETE``);
- ``LIST``: the key's rows are its whole new list, ordered by ``list_index`` (needed when
  there are several); one row without a value deletes the list;
- ``MAP``: a row with a map key puts that entry (``MAP_PUT``), or removes it without a
  value (``MAP_REMOVE``); a row without map key nor value deletes the key's whole map
  (and may not come with entries of the same key).

Values are the states' stored bytes without expiry; a TTL'd state's rows carry their
expiry (``expires_at_ms``), which is stored in front of the value as the backend does, and
each key's TTL'd state gets an expiry timer at its earliest expiry (the timer that removes
it once expired, as the backend registers one when it writes the state:
:func:`expiry_timer_ops`).

Each entry may be written once per state write: a task reports a 64-bit hash of each unit
it wrote (``(state, key)``, or ``(state, key, map key)`` for maps) with the index of its
state, 12 bytes a row, and the driver refuses a unit written twice, by one task or by two
(:func:`colliding_units`), before anything is committed.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import ChangelogError
from ...keygroups import KeyGroupRange, key_group_for_key
from ...storage import StateChangelogStorage
from ..backend.keyed_time import TIMERS_META
from ..schema.descriptors import StateKind
from ..schema.ops import DELETE, LIST_REPLACE, MAP_PUT, MAP_REMOVE, SET, StateMeta, StateOp
from ..schema.ttl import split_serializer_name, stamp
from ..time.timers import TIMERS_STATE, TimeDomain, timer_map_key

#: How long a task waits for its log's records to be acknowledged.
PERSIST_TIMEOUT_S = 600.0


class StateWriteError(ChangelogError, ValueError):
    """A state write refused: what was wrong (state, key, column, checkpoint) and what to
    do instead. Nothing it wrote is referenced by any checkpoint."""


@dataclass(frozen=True, slots=True)
class EntryChange:
    """One row of a state write: what one entry of ``state`` for ``key`` becomes.

    ``map_key``: map states' entry (None: the whole map); ``list_index``: a list
    element's place; ``value``: the value's stored bytes without expiry (None: delete);
    ``expires_at_ms``: a TTL'd state's entry expiry (milliseconds since the epoch);
    ``key_group``: the key's, when the caller computed it for many keys at once (None:
    computed from the key).
    """

    state: str
    key: bytes
    value: bytes | None
    map_key: bytes | None = None
    list_index: int | None = None
    expires_at_ms: int | None = None
    key_group: int | None = None


@dataclass
class WrittenChanges:
    """What one task wrote: its log's handle (None: no row) and the units it wrote
    (64-bit hashes, with the index in ``states`` of each unit's state)."""

    handle_bytes: bytes | None
    states: list[str] = field(default_factory=list)
    unit_hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    unit_states: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    rows: int = 0
    ops: int = 0
    #: The states of ``states`` whose rows of a key are one unit, which must be in one
    #: task: lists, and maps when the write replaces the state (their layers replace a
    #: key's whole map, see :mod:`.state_layers`).
    whole_states: tuple[str, ...] = ()
    #: A replacing write's snapshot layers: (subtask, ``SnapshotHandle`` bytes) of the
    #: chunks this task wrote, per subtask of the new checkpoint it wrote key groups of.
    layers: tuple[tuple[int, bytes], ...] = ()


def unit_hash(state: str, key: bytes, map_key: bytes | None) -> int:
    """The 64-bit hash of an entry unit (the same in every process)."""
    name = state.encode()
    # Lengths first: no two units give the same bytes; -1 for "no map key".
    header = _UNIT_HEADER.pack(len(name), len(key), -1 if map_key is None else len(map_key))
    digest = _blake2b(b"".join((header, name, key, map_key or b"")), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


_UNIT_HEADER = struct.Struct(">iii")
_blake2b = hashlib.blake2b


def _describe(change: EntryChange) -> str:
    where = f"state {change.state!r} key {change.key!r}"
    if change.map_key is not None:
        where += f" map key {change.map_key!r}"
    return where


class WrittenUnits:
    """The units one task wrote, as compact arrays (its message to the driver)."""

    def __init__(self, states: Sequence[str]) -> None:
        self.index = {name: i for i, name in enumerate(states)}
        self.hashes = array("Q")
        self.states = array("i")

    def add(self, change: EntryChange, map_key: bytes | None) -> None:
        self.hashes.append(unit_hash(change.state, change.key, map_key))
        self.states.append(self.index[change.state])

    def changes(self, handle: bytes | None, rows: int, ops: int,
                whole: tuple[str, ...], layers: tuple[tuple[int, bytes], ...] = ()
                ) -> WrittenChanges:
        """What the task wrote: these units, with its log's handle and the rest."""
        return WrittenChanges(handle, list(self.index), np.frombuffer(self.hashes, np.uint64)
                              .copy(), np.frombuffer(self.states, np.int32).copy(), rows, ops,
                              whole, layers)


def whole_states(metas: Mapping[str, StateMeta], deletes: bool) -> tuple[str, ...]:
    """The states whose rows of one key form one unit (see
    :attr:`WrittenChanges.whole_states`): lists; maps too in a replacing write
    (``deletes`` false)."""
    whole = (StateKind.LIST,) if deletes else (StateKind.LIST, StateKind.MAP)
    return tuple(sorted(n for n, meta in metas.items() if meta.kind in whole))


#: Expiry per (key group, state, key) of a TTL'd state: the earliest of its rows'.
Expiries = dict[tuple[int, str, bytes], int]


def state_ops(changes: Iterable[EntryChange], metas: Mapping[str, StateMeta],
              units: WrittenUnits, deletes: bool = True, max_parallelism: int = 128,
              expiries: Expiries | None = None) -> Iterator[tuple[int, StateOp]]:
    """The ops of ``changes`` (see the module docstring) with their key groups, value and
    map rows as they come, lists once all rows are read; refuses what the module
    docstring refuses, and without ``deletes`` (a replacing write) any row without a
    value. ``expiries`` collects the earliest expiry of each TTL'd state's key written."""
    lists: dict[tuple[str, bytes], list[tuple[EntryChange, bytes | None]]] = {}
    whole_maps: set[tuple[str, bytes]] = set()
    map_entries: set[tuple[str, bytes]] = set()
    for change in changes:
        group = (change.key_group if change.key_group is not None
                 else key_group_for_key(change.key, max_parallelism))
        meta = meta_of(change, metas)
        stored = _stored_value(change, meta)
        if expiries is not None and stored is not None and change.expires_at_ms is not None:
            at = (group, change.state, change.key)
            known = expiries.get(at)
            expiries[at] = (change.expires_at_ms if known is None
                            else min(known, change.expires_at_ms))
        if stored is None and not deletes:
            raise StateWriteError(
                f"{_describe(change)}: a row without value deletes an entry, and a write "
                "replacing the whole state has nothing to delete (leave the row out)")
        kind = meta.kind
        if kind is StateKind.LIST:
            if change.map_key is not None:
                raise StateWriteError(f"{_describe(change)}: column map_key is for map "
                                      "states; this state is a LIST")
            lists.setdefault((change.state, change.key), []).append((change, stored))
            continue
        if kind is StateKind.MAP:
            if change.list_index is not None:
                raise StateWriteError(f"{_describe(change)}: column list_index is for list "
                                      "states; this state is a MAP")
            if change.map_key is None:
                if stored is not None:
                    raise StateWriteError(
                        f"{_describe(change)}: a map state's row with a value needs a "
                        "map_key (a row without map key nor value deletes the whole map)")
                units.add(change, None)
                whole_maps.add((change.state, change.key))
                yield group, StateOp(change.state, DELETE, change.key)
                continue
            units.add(change, change.map_key)
            map_entries.add((change.state, change.key))
            yield group, (StateOp(change.state, MAP_REMOVE, change.key, map_key=change.map_key)
                          if stored is None else
                          StateOp(change.state, MAP_PUT, change.key, map_key=change.map_key,
                                  value=stored))
            continue
        if change.map_key is not None or change.list_index is not None:
            column = "map_key" if change.map_key is not None else "list_index"
            raise StateWriteError(f"{_describe(change)}: column {column} must be null for a "
                                  f"{kind.value} state")
        units.add(change, None)
        yield group, (StateOp(change.state, DELETE, change.key) if stored is None
                      else StateOp(change.state, SET, change.key, value=stored))
    for state, key in sorted(whole_maps & map_entries):
        raise StateWriteError(
            f"state {state!r} key {key!r}: a row deleting the whole map and rows of its "
            "entries in one state write (write the deletion, then the entries, in two)")
    if not deletes:
        # A replacing write's layers hold a key's whole map: one task's rows of it.
        for state, key in sorted(map_entries):
            units.add(EntryChange(state, key, None), None)
    for (state, key), rows in lists.items():
        first = rows[0][0].key_group
        yield (first if first is not None else key_group_for_key(key, max_parallelism),
               _list_op(state, key, rows, units))


def expiry_timer_ops(expiries: Expiries) -> list[tuple[int, StateOp]]:
    """An expiry timer per TTL'd state and key written, at its earliest expiry: the map
    entry of the timers state the backend puts when it writes a TTL'd state (a key already
    holding one keeps it too: the earlier of the two finds what is due and re-arms)."""
    return [(group, StateOp(TIMERS_STATE, MAP_PUT, key,
                            map_key=timer_map_key(TimeDomain.EXPIRY, at, state.encode()),
                            value=b""))
            for (group, state, key), at in sorted(expiries.items())]


def _list_op(state: str, key: bytes, rows: list[tuple[EntryChange, bytes | None]],
             units: WrittenUnits) -> StateOp:
    """The op of a list's rows (each with its stored value)."""
    first = rows[0][0]
    units.add(first, None)
    if any(stored is None for _, stored in rows):
        if len(rows) > 1:
            raise StateWriteError(
                f"{_describe(first)}: a list row without value deletes the list and must be "
                f"its key's only row (found {len(rows)})")
        return StateOp(state, DELETE, key)
    if len(rows) > 1:
        indexes = [row.list_index for row, _ in rows]
        if any(index is None for index in indexes) or len(set(indexes)) != len(indexes):
            raise StateWriteError(
                f"{_describe(first)}: {len(rows)} list elements need distinct list_index "
                f"values to be put in order (found {indexes})")
        rows = sorted(rows, key=lambda pair: pair[0].list_index or 0)
    return StateOp(state, LIST_REPLACE, key, values=tuple(stored or b"" for _, stored in rows))


def meta_of(change: EntryChange, metas: Mapping[str, StateMeta]) -> StateMeta:
    """The registration of ``change``'s state; refused naming the known ones."""
    meta = metas.get(change.state)
    if meta is not None:
        return meta
    if change.state == TIMERS_STATE:
        raise StateWriteError(f"state {TIMERS_STATE!r} holds the timers, which a state write "
                              "does not write")
    raise StateWriteError(
        f"state {change.state!r} is not a registered state of the application (known: "
        f"{sorted(metas)}): declare it (states=[...]) to write it")


def _stored_value(change: EntryChange, meta: StateMeta) -> bytes | None:
    """The bytes stored for ``change.value``: the expiry in front for a TTL'd state."""
    _, with_ttl = split_serializer_name(meta.value_serializer)
    if change.value is None:
        return None
    if with_ttl:
        if change.expires_at_ms is None:
            raise StateWriteError(f"{_describe(change)}: the state has a TTL, so each row "
                                  "with a value needs expires_at (when the entry expires)")
        return stamp(change.expires_at_ms, change.value)
    if change.expires_at_ms is not None:
        raise StateWriteError(f"{_describe(change)}: column expires_at must be null: the state "
                              "has no TTL")
    return change.value


class CountedRows:
    """``changes``, counted as they are read (:attr:`count`)."""

    def __init__(self, changes: Iterable[EntryChange]) -> None:
        self._changes = changes
        self.count = 0

    def __iter__(self) -> Iterator[EntryChange]:
        for change in self._changes:
            self.count += 1
            yield change


def append_timer_ops(writer: Any, expiries: Expiries) -> int:
    """Append the expiry timers of ``expiries`` (the timers state registered first) to a
    changelog writer; how many."""
    timers = expiry_timer_ops(expiries)
    if timers:
        writer.append_meta(TIMERS_META.to_bytes())
        for key_group, op in timers:
            writer.append(key_group, op.to_bytes())
    return len(timers)


def write_entry_changes(storage: StateChangelogStorage[Any], operator: str,
                        max_parallelism: int, checkpoint_id: int,
                        metas: Mapping[str, StateMeta],
                        changes: Iterable[EntryChange], deletes: bool = True
                        ) -> WrittenChanges:
    """Append the ops of ``changes`` to a new log of ``storage``, each state registered
    before its first op, persist it for ``checkpoint_id`` and return what was written (a
    failed persist raises; its records are referenced by nothing). ``deletes``: see
    :func:`state_ops`."""
    units = WrittenUnits(sorted(metas))
    rows = CountedRows(changes)

    def fill(writer: Any) -> int:
        registered: set[str] = set()
        expiries: Expiries = {}
        ops = 0
        for key_group, op in state_ops(rows, metas, units, deletes, max_parallelism,
                                       expiries):
            if op.state not in registered:
                writer.append_meta(metas[op.state].to_bytes())
                registered.add(op.state)
            writer.append(key_group, op.to_bytes())
            ops += 1
        return ops + append_timer_ops(writer, expiries)

    handle, ops = persisted_log(storage, operator, max_parallelism, checkpoint_id, fill)
    return units.changes(handle, rows.count, ops, whole_states(metas, deletes))


def persisted_log(storage: StateChangelogStorage[Any], operator: str, max_parallelism: int,
                  checkpoint_id: int, fill: Callable[[Any], int]) -> tuple[bytes | None, int]:
    """A new log of ``storage`` over every key group, filled by ``fill`` (given the
    writer; it returns how many ops it appended) and persisted for ``checkpoint_id``: its
    handle (None when nothing was appended: nothing is persisted) and the ops."""
    writer = storage.create_writer(operator, KeyGroupRange(0, max_parallelism - 1))
    try:
        start = writer.initial_sequence_number()
        ops = fill(writer)
        if not ops:
            return None, 0
        piece = writer.persist(start, checkpoint_id).result(timeout=PERSIST_TIMEOUT_S).job_owned
    finally:
        writer.close()
    return (piece.to_bytes() if piece is not None else None), ops


def colliding_units(written: Sequence[tuple[int, WrittenChanges]]) -> str | None:
    """A description of the units written more than once (``(task, written)`` pairs), by
    one task or by several; None when every unit was written once: how many, and per
    state the tasks that wrote them."""
    parts = [(task, w) for task, w in written if w.unit_hashes.size]
    if not parts:
        return None
    hashes = np.concatenate([w.unit_hashes for _, w in parts])
    ordered = np.sort(hashes)
    again = ordered[1:] == ordered[:-1]
    if not again.any():
        return None
    repeated = np.unique(ordered[1:][again])
    mask = np.isin(hashes, repeated)
    by_state: dict[str, set[int]] = {}
    start = 0
    for task, w in parts:
        mine = mask[start:start + w.unit_hashes.size]
        start += w.unit_hashes.size
        for index in np.unique(w.unit_states[mine]).tolist():
            by_state.setdefault(w.states[index], set()).add(task)
    count = f"{repeated.size} entries have" if repeated.size > 1 else "1 entry has"
    described = (f"{count} more than one row (" + "; ".join(
        f"state {name!r}: in Spark task(s) {sorted(ts)}" for name, ts in sorted(by_state.items()))
        + ")")
    wholes = sorted({n for _, w in parts for n in w.whole_states} & set(by_state))
    if wholes:
        # Such rows are grouped in their task: a unit seen twice was split over tasks.
        described += (f"; the rows of one key of state(s) {wholes} (a list, or a map the "
                      "write replaces) must all be in one Spark task: partition the rows by "
                      "key first, e.g. df.repartition('key')")
    if set(by_state) - set(wholes):
        described += "; each entry may be written once per state write (drop the duplicates)"
    return described


__all__ = [
    "CountedRows",
    "EntryChange",
    "StateWriteError",
    "WrittenChanges",
    "WrittenUnits",
    "append_timer_ops",
    "colliding_units",
    "expiry_timer_ops",
    "meta_of",
    "persisted_log",
    "state_ops",
    "unit_hash",
    "whole_states",
    "write_entry_changes",
]
