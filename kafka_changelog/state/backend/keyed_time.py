"""The keyed backend's time: TTL expiry and timers (a part of
:class:`~kafka_changelog.state.backend.keyed_backend.ChangelogKeyedStateBackend`).

Invariants this part keeps:

- TTL and processing-time timers see one processing time, :meth:`processing_time_ms`:
  the one fixed by :meth:`set_processing_time` (streaming fixes the batch's), else the
  wall clock.
- Timers are entries of the reserved map state ``__kc_timers``
  (:data:`~kafka_changelog.state.time.timers.TIMERS_STATE`), registered and logged like
  any state (:meth:`ensure_timers_state`), so they are snapshotted, restored and rescaled
  with it. No user's state may take that name (the working copy refuses it).
- Expiry timers are the backend's own domain: one per key and TTL'd state at its earliest
  expiry; :meth:`expire_due` removes the expired entries as logged changes, so state
  nobody reads still leaves; users' timers (:meth:`due_timers`) never include them.

What it needs of the backend (the working copy and its log) is declared below, as
attributes and methods the backend defines.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..schema.descriptors import StateDescriptor, StateKind, map_state
from ..schema.ops import StateMeta
from ..schema.ttl import split_serializer_name
from ..tables.key_buffer import KeyChangeBuffer
from ..tables.protocol import KeyedStateTable
from ..time.timers import TIMERS_STATE, TimeDomain, Timer, TimerService
from ..time.ttl_state import expire_entries

#: The registration of the reserved state of every key's timers.
TIMERS_META = StateMeta(TIMERS_STATE, StateKind.MAP, "bytes", "bytes")
TIMERS_DESCRIPTOR = map_state(TIMERS_STATE)


class KeyedTime:
    """TTL expiry and timers of a keyed backend's keys."""

    # The backend's working copy, as this part uses it.
    _table: KeyedStateTable
    _buffer: KeyChangeBuffer
    _descriptors: dict[str, StateDescriptor]
    # This part's own: the fixed processing time (None: the wall clock) and the timers
    # (a TimerService over the whole backend, made last in its constructor).
    _processing_time_ms: int | None
    _timers: TimerService

    if TYPE_CHECKING:
        def set_current_key(self, key: bytes, key_group: int | None = None) -> None: ...

        def _append_meta(self, meta: StateMeta) -> None: ...

    def set_processing_time(self, time_ms: int | None) -> None:
        """Fix the processing time (ms since the epoch) that TTL and processing-time timers
        see until the next call (streaming sets the batch's); None: the wall clock."""
        self._processing_time_ms = time_ms

    def processing_time_ms(self) -> int:
        """The processing time TTL and timers see now."""
        fixed = self._processing_time_ms
        return fixed if fixed is not None else int(time.time() * 1000)

    @property
    def timers(self) -> TimerService:
        """The timers of this backend's keys (register/delete act on the current key)."""
        return self._timers

    def ensure_timers_state(self) -> None:
        """Register the reserved timers state (once)."""
        if TIMERS_STATE not in self._descriptors and TIMERS_STATE not in self._table.metas:
            self._buffer.flush()
            self._table.register(TIMERS_META)
            self._append_meta(TIMERS_META)
        self._descriptors.setdefault(TIMERS_STATE, TIMERS_DESCRIPTOR)

    def _expires(self, state: str, expires_at_ms: int) -> None:
        self._timers.expire_at(state.encode(), expires_at_ms)

    def expire_due(self) -> int:
        """Remove the TTL'd entries expired at the processing time (their keys' expiry
        timers being due), as logged changes; returns how many keys' states were looked
        at. Entries refreshed since keep a timer at their new expiry."""
        now = self.processing_time_ms()
        due = self._timers.pop_due(TimeDomain.EXPIRY, now)
        metas = self._table.metas
        for timer in due:
            meta = metas.get(timer.tag.decode())
            if meta is None or not split_serializer_name(meta.value_serializer)[1]:
                continue  # dropped, or no longer TTL'd
            self.set_current_key(timer.key, timer.key_group)
            following = expire_entries(self._buffer, meta.state, now)
            if following is not None:
                self._timers.expire_at(timer.tag, following)
        return len(due)

    def due_timers(self, domain: TimeDomain, upto_ms: int) -> list[Timer]:
        """Take the users' timers of ``domain`` due at ``upto_ms`` (removed from the state
        as logged changes), in firing order."""
        if domain is TimeDomain.EXPIRY:
            raise ValueError("expiry timers are the backend's: see expire_due")
        return self._timers.pop_due(domain, upto_ms)
