"""Timers per key, in processing time and event time, kept as keyed state.

A timer belongs to a key: it lives in the key's key group, in a reserved map state
(:data:`TIMERS_STATE`: map key = domain, time, tag; value empty), so it is logged,
snapshotted, restored at any parallelism and follows a rescale like any other state: a
timer registered by subtask 1 of 2 fires on whichever subtask owns its key group later.
An index by time (a heap per domain) finds the due timers without scanning the state; it
is built from the reserved state the first time a backend needs it (cost: its timers, not
its state) and kept up to date by every registration.

Invariants: a timer fires at most once per committed history (firing removes it from the
state as a logged change, in the same checkpoint as what its callback does); a re-run from
the same checkpoint with the same time and watermark fires the same timers in the same
order (time, then key group, key, tag); the index may hold timers that were deleted since
(lazy deletion): every candidate is checked against the state before it fires.

The third domain, :attr:`TimeDomain.EXPIRY`, is the backend's own: one timer per key and
TTL'd state, at (or before) the state's earliest expiry, which removes the expired entries
when due (see :mod:`kafka_changelog.state.time.ttl_state`), so that expired state leaves the
working copy and the snapshots even when nobody reads it again.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ...enums import StrEnum
from ..schema.ops import MAP_PUT, MAP_REMOVE, OpKind
from ..tables.protocol import Entry, KeyedStateTable

#: The reserved state holding every key's timers.
TIMERS_STATE = "__kc_timers"
#: Times are stored offset by 2**63 (unsigned, big-endian), which orders negatives first.
_OFFSET = 1 << 63
_TIME = struct.Struct(">Q")


class TimeDomain(StrEnum):
    """Which clock a timer follows."""

    #: The batch's processing time.
    PROCESSING_TIME = "processing_time"
    #: The event-time watermark.
    EVENT_TIME = "event_time"
    #: The backend's own TTL expiry timers (tag: the state's name).
    EXPIRY = "expiry"


_DOMAIN_BYTES = {TimeDomain.PROCESSING_TIME: b"\x00", TimeDomain.EVENT_TIME: b"\x01",
                 TimeDomain.EXPIRY: b"\x02"}
_DOMAINS = {b[0]: d for d, b in _DOMAIN_BYTES.items()}


@dataclass(frozen=True, order=True)
class Timer:
    """A timer of one key: fires when its domain's clock reaches ``time_ms``."""

    time_ms: int
    domain: TimeDomain
    key_group: int
    key: bytes
    #: The backend's tag (expiry timers: the state's name); empty for users' timers.
    tag: bytes = b""


def timer_map_key(domain: TimeDomain, time_ms: int, tag: bytes = b"") -> bytes:
    """The map key of a timer in :data:`TIMERS_STATE`."""
    return _DOMAIN_BYTES[domain] + _TIME.pack(time_ms + _OFFSET) + tag


def timer_map_keys(domain: TimeDomain, times_ms: Sequence[int]) -> list[bytes]:
    """:func:`timer_map_key` of each time (no tag), for many timers at once."""
    prefix, pack = _DOMAIN_BYTES[domain], _TIME.pack
    return [prefix + pack(time_ms + _OFFSET) for time_ms in times_ms]


def parse_timer_map_key(map_key: bytes) -> tuple[TimeDomain, int, bytes]:
    """(domain, time, tag) of a map key of :data:`TIMERS_STATE`."""
    if len(map_key) < 9 or map_key[0] not in _DOMAINS:
        raise ValueError(f"not a timer entry: {map_key.hex()}")
    return _DOMAINS[map_key[0]], _TIME.unpack_from(map_key, 1)[0] - _OFFSET, map_key[9:]


class TimerHost(Protocol):
    """What the timer service needs of the keyed backend."""

    @property
    def table(self) -> KeyedStateTable: ...

    def current(self) -> tuple[int, bytes]: ...

    def set_current_key(self, key: bytes, key_group: int | None = None) -> None: ...

    def read(self, state: str) -> Entry | None: ...

    def read_map_value(self, state: str, map_key: bytes) -> bytes | None: ...

    def write(self, state: str, op: OpKind, map_key: bytes | None = None,
              value: bytes | None = None, values: tuple[bytes, ...] | None = None) -> None: ...

    def mutate_columns(self, state: str, op: OpKind, key_groups: Sequence[int],
                       keys: Sequence[bytes], map_keys: Sequence[bytes | None] | None = None,
                       values: Sequence[bytes | None] | None = None) -> None: ...

    def ensure_timers_state(self) -> None: ...

    def key_groups(self) -> Iterator[int]: ...


class TimerService:
    """The timers of one backend's key groups (see the module docstring)."""

    def __init__(self, host: TimerHost) -> None:
        self._host = host
        self._heaps: dict[TimeDomain, list[Timer]] | None = None
        # (key group, key, state name) with an expiry timer: at most one each.
        self._expiring: set[tuple[int, bytes, bytes]] = set()

    def _index(self) -> dict[TimeDomain, list[Timer]]:
        if self._heaps is None:
            heaps: dict[TimeDomain, list[Timer]] = {d: [] for d in TimeDomain}
            table = self._host.table
            if TIMERS_STATE in table.metas:
                for key_group in self._host.key_groups():
                    for key, entry in table.state_entries(key_group, TIMERS_STATE):
                        assert isinstance(entry, dict)
                        for map_key in entry:
                            domain, time_ms, tag = parse_timer_map_key(map_key)
                            heaps[domain].append(Timer(time_ms, domain, key_group, key, tag))
                            if domain is TimeDomain.EXPIRY:
                                self._expiring.add((key_group, key, tag))
            for heap in heaps.values():
                heapq.heapify(heap)
            self._heaps = heaps
        return self._heaps

    def register(self, domain: TimeDomain, time_ms: int, tag: bytes = b"") -> None:
        """A timer of the current key at ``time_ms`` (a second one at the same time is the
        same timer)."""
        host = self._host
        key_group, key = host.current()
        host.ensure_timers_state()
        map_key = timer_map_key(domain, time_ms, tag)
        if host.read_map_value(TIMERS_STATE, map_key) is None:
            host.write(TIMERS_STATE, MAP_PUT, map_key, b"")
            heapq.heappush(self._index()[domain], Timer(time_ms, domain, key_group, key, tag))

    def delete(self, domain: TimeDomain, time_ms: int, tag: bytes = b"") -> None:
        """Delete the current key's timer at ``time_ms`` (no-op if there is none)."""
        map_key = timer_map_key(domain, time_ms, tag)
        if self._host.read_map_value(TIMERS_STATE, map_key) is not None:
            self._host.write(TIMERS_STATE, MAP_REMOVE, map_key)

    def register_many(self, domain: TimeDomain, key_groups: Sequence[int],
                      keys: Sequence[bytes], times_ms: Sequence[int]) -> None:
        """A timer of each ``keys[i]`` (in ``key_groups[i]``) at ``times_ms[i]``: the
        changes :meth:`register` logs key by key, in one write of the timers state (the
        keys in the order given; a timer the key has, or that an earlier entry of the
        same call gave it, is not written again)."""
        host = self._host
        host.ensure_timers_state()
        index = self._index()  # built before the writes, which are added to it below
        table = host.table  # the current key's buffered changes applied first
        groups, fresh_keys, map_keys, times = self._select(
            table, domain, key_groups, keys, times_ms, present=False)
        if not fresh_keys:
            return
        host.mutate_columns(TIMERS_STATE, MAP_PUT, groups, fresh_keys, map_keys,
                            [b""] * len(fresh_keys))
        timers = index[domain]
        added = [Timer(t, domain, kg, key) for kg, key, t in
                 zip(groups, fresh_keys, times, strict=True)]
        if len(added) > len(timers):
            timers.extend(added)
            heapq.heapify(timers)
        else:
            for timer in added:
                heapq.heappush(timers, timer)

    def delete_many(self, domain: TimeDomain, key_groups: Sequence[int],
                    keys: Sequence[bytes], times_ms: Sequence[int]) -> None:
        """Delete each ``keys[i]``'s timer at ``times_ms[i]`` (none: nothing logged for
        it): the changes :meth:`delete` logs key by key, in one write."""
        host = self._host
        if TIMERS_STATE not in host.table.metas:
            return  # no key has a timer
        host.ensure_timers_state()  # e.g. restored: in the table, not yet registered here
        groups, present_keys, map_keys, _ = self._select(
            host.table, domain, key_groups, keys, times_ms, present=True)
        if present_keys:
            host.mutate_columns(TIMERS_STATE, MAP_REMOVE, groups, present_keys, map_keys)

    @staticmethod
    def _select(table: KeyedStateTable, domain: TimeDomain, key_groups: Sequence[int],
                keys: Sequence[bytes], times_ms: Sequence[int], present: bool
                ) -> tuple[list[int], list[bytes], list[bytes], list[int]]:
        """The timers among ``keys``/``times_ms`` that the state has (``present``) or has
        not, each once, in the order given."""
        if not len(key_groups) == len(keys) == len(times_ms):
            raise ValueError(f"timers: {len(keys)} keys, {len(key_groups)} key groups and "
                             f"{len(times_ms)} times")
        wanted = timer_map_keys(domain, times_ms)
        # Whether each timer is there: one multi-get, not a point read per key.
        stored = table.get_map_values(key_groups, TIMERS_STATE, keys, wanted)
        if len(set(zip(keys, wanted, strict=True))) == len(wanted):  # no timer twice (usual)
            chosen_at = [i for i, value in enumerate(stored) if (value is not None) == present]
            return ([key_groups[i] for i in chosen_at], [keys[i] for i in chosen_at],
                    [wanted[i] for i in chosen_at], [times_ms[i] for i in chosen_at])
        seen: set[tuple[int, bytes, bytes]] = set()
        groups: list[int] = []
        chosen: list[bytes] = []
        map_keys: list[bytes] = []
        times: list[int] = []
        for key_group, key, map_key, time_ms, value in zip(key_groups, keys, wanted, times_ms,
                                                          stored, strict=True):
            timer = (key_group, key, map_key)
            if timer in seen:
                continue
            seen.add(timer)
            if (value is not None) == present:
                groups.append(key_group)
                chosen.append(key)
                map_keys.append(map_key)
                times.append(time_ms)
        return groups, chosen, map_keys, times

    def of_current_key(self) -> list[Timer]:
        """The current key's timers (users' and expiry), ordered by domain then time."""
        key_group, key = self._host.current()
        entry = self._host.read(TIMERS_STATE)
        if not isinstance(entry, dict):
            return []
        found = []
        for map_key in sorted(entry):
            domain, time_ms, tag = parse_timer_map_key(map_key)
            found.append(Timer(time_ms, domain, key_group, key, tag))
        return found

    def expire_at(self, state: bytes, expires_at_ms: int) -> None:
        """Make sure the current key has an expiry timer of ``state`` (at ``expires_at_ms``
        when it has none: a later one is moved on when it fires)."""
        key_group, key = self._host.current()
        self._index()  # builds the set of keys with one
        if (key_group, key, state) not in self._expiring:
            self.register(TimeDomain.EXPIRY, expires_at_ms, state)
            self._expiring.add((key_group, key, state))

    def pop_due(self, domain: TimeDomain, upto_ms: int) -> list[Timer]:
        """Remove and return the timers of ``domain`` due at ``upto_ms`` (time <= it),
        ordered by time, key group, key, tag; the current key is left at the last one's.
        Each is removed from the state (a logged change) as it is taken."""
        heap = self._index()[domain]
        host = self._host
        due: list[Timer] = []
        while heap and heap[0].time_ms <= upto_ms:
            timer = heapq.heappop(heap)
            host.set_current_key(timer.key, timer.key_group)
            map_key = timer_map_key(domain, timer.time_ms, timer.tag)
            if host.read_map_value(TIMERS_STATE, map_key) is None:
                continue  # deleted since it was indexed
            host.write(TIMERS_STATE, MAP_REMOVE, map_key)
            if domain is TimeDomain.EXPIRY:
                self._expiring.discard((timer.key_group, timer.key, timer.tag))
            if not due or due[-1] != timer:
                due.append(timer)
        return due

    def next_time(self, domain: TimeDomain) -> int | None:
        """The earliest indexed time of ``domain`` (maybe of a deleted timer)."""
        heap = self._index()[domain]
        return heap[0].time_ms if heap else None


__all__ = ["TIMERS_STATE", "TimeDomain", "Timer", "TimerHost", "TimerService",
           "parse_timer_map_key", "timer_map_key"]
