"""The vectorised entry point of stateful streaming: one call per subtask per batch.

With ``stateful_foreach_batch(..., vectorized=True)`` the user's function is
``fn(rows, state)``: ``rows`` are all of a subtask's rows of the micro-batch (user
columns only, sorted by key then ``order_by``, index ``0..n-1``) and ``state`` a
:class:`BatchState`, a :class:`~kafka_changelog.state.backend.bulk_state.BulkState` over the
subtask's backend opened for the batch's distinct keys. The function folds rows with
pandas (``groupby`` aggregates) and reads and writes the state of many keys per call,
instead of being called once per key with a state object per call; it returns the
output rows (a DataFrame, a dict for one row, an iterable of dicts, or None), like the
per-key function.

The keys are given by their natural values, exactly as the per-key API gives them
(``str`` for a string column, ``int``,
``bytes``, ``Decimal``, ``datetime.date``, ``pandas.Timestamp``..., a tuple of them for
several key columns); the view maps each to the key bytes and key group Spark computed
for its rows. ``state.key_index`` gives the position in ``state.keys`` of each row's
key: ``rows.groupby(state.key_index)`` groups rows per key in the order of
``state.keys``, whatever the key columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Set
from typing import Any

import numpy as np
import pandas as pd

from kafka_changelog.state.backend.bulk_state import BulkState
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.time.timers import TimeDomain, Timer

from .key_runs import keys_at, run_starts
from .key_state import BatchContext, KeyState, KeyTimers, TimerInfo, to_ms
from .output_rows import output_records


class BulkTimers:
    """The timers of many of a batch's keys (``keys`` as :attr:`BatchState.keys` gives
    them; ``times`` ms since the epoch or datetimes, one per key), from within a call."""

    def __init__(self, view: BulkState, timers: KeyTimers) -> None:
        self._view = view
        self._timers = timers

    def _columns(self, keys: Iterable[Any], times: Iterable[Any]
                 ) -> tuple[list[int], list[bytes], list[int]]:
        """Key groups, key bytes and times in ms of ``keys`` and ``times``."""
        groups, key_bytes, _ = self._view.resolve(keys)
        # Integer arrays and Series convert at once (datetimes go one by one, as to_ms
        # reads them).
        dtype = getattr(times, "dtype", None)
        listed = (times.tolist() if dtype is not None and dtype.kind in "iu"  # type: ignore[attr-defined]
                  else list(times))
        if len(listed) != len(key_bytes):
            raise ValueError(f"timers: {len(key_bytes)} keys but {len(listed)} times")
        return groups, key_bytes, [to_ms(when) for when in listed]

    def register_processing_time(self, keys: Iterable[Any], times: Iterable[Any]) -> None:
        """A processing-time timer per key (see ``KeyTimers.register_processing_time``),
        written for all the keys at once."""
        service = self._timers.service("registered")
        service.register_many(TimeDomain.PROCESSING_TIME, *self._columns(keys, times))

    def register_event_time(self, keys: Iterable[Any], times: Iterable[Any]) -> None:
        """An event-time timer per key (see ``KeyTimers.register_event_time``), written for
        all the keys at once."""
        service = self._timers.event_service("registered")
        service.register_many(TimeDomain.EVENT_TIME, *self._columns(keys, times))

    def delete_processing_time(self, keys: Iterable[Any], times: Iterable[Any]) -> None:
        """Delete each key's processing-time timer at its time (no-op where none)."""
        service = self._timers.service("deleted")
        service.delete_many(TimeDomain.PROCESSING_TIME, *self._columns(keys, times))

    def delete_event_time(self, keys: Iterable[Any], times: Iterable[Any]) -> None:
        """Delete each key's event-time timer at its time (no-op where none)."""
        service = self._timers.event_service("deleted")
        service.delete_many(TimeDomain.EVENT_TIME, *self._columns(keys, times))

    def list(self, keys: Iterable[Any]) -> list[list[TimerInfo]]:
        """Each key's timers."""
        groups, key_bytes, _ = self._view.resolve(keys)
        set_current_key = self._view.backend.set_current_key
        found = []
        for key_group, key in zip(groups, key_bytes, strict=True):
            set_current_key(key, key_group)
            found.append(self._timers.list())
        return found


class BatchState(BulkState):
    """The bulk state of one subtask's micro-batch: :attr:`keys` are the batch's distinct
    keys in key order (the order of the rows), and :attr:`key_index` maps each row to its
    key; :attr:`context` is the batch's, :attr:`timers` the keys' timers."""

    def __init__(self, backend: ChangelogKeyedStateBackend, keys: Iterable[Any],
                 key_bytes: Iterable[bytes], key_groups: Iterable[int],
                 key_index: np.ndarray[Any, Any], key_state: KeyState | None = None) -> None:
        super().__init__(backend, keys, key_bytes, key_groups)
        #: For each row of the function's ``rows``, the position of its key in ``keys``
        #: (ascending: rows are sorted by key).
        self.key_index = key_index
        key_state = key_state or KeyState(backend)
        #: The batch this call belongs to.
        self.context: BatchContext | None = key_state.context
        #: The timers of :attr:`keys`.
        self.timers = BulkTimers(self, key_state.timers)


#: ``fn(rows, state) -> output rows`` (a DataFrame, a dict for one row, an iterable of
#: dicts, or None): a subtask's rows of the batch and the :class:`BatchState` of its keys.
VectorizedFunction = Callable[[pd.DataFrame, BatchState], Any]

#: ``on_timer(timers, state) -> output rows``: once per subtask per batch with every due
#: timer: ``timers`` has columns ``key_index`` (the position of the timer's key in
#: ``state.keys``), ``time_ms`` and ``domain``, in firing order; ``state`` is the
#: :class:`BatchState` of the timers' keys.
VectorizedTimerFunction = Callable[[pd.DataFrame, BatchState], Any]


def call_vectorized(fn: VectorizedFunction, backend: ChangelogKeyedStateBackend,
                    rows: pd.DataFrame, key_bytes: pd.Series, key_groups: pd.Series,
                    key_columns: Sequence[str], natural: Callable[[Any], Any],
                    output_columns: Set[str] | None = None, key_state: KeyState | None = None
                    ) -> tuple[list[dict[str, Any]], int]:
    """Call ``fn`` once with ``rows`` (a subtask's non-empty batch, user columns, sorted
    by key bytes) and the :class:`BatchState` of their keys; ``key_bytes`` and
    ``key_groups`` are each row's state key and key group, ``natural`` turns a key
    column's value into the key the per-key API would give. Returns the output records
    (each with exactly ``output_columns``, if given) and the number of keys."""
    encoded = key_bytes.to_numpy()
    starts = run_starts(encoded)
    key_index = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(encoded))))
    keys = keys_at(rows, starts, key_columns, natural)
    state = BatchState(
        backend, keys, [k if type(k) is bytes else bytes(k) for k in encoded[starts]],
        key_groups.to_numpy()[starts].tolist(), key_index, key_state)
    if key_state is not None:
        key_state.calling(True)
    try:
        produced = fn(rows.reset_index(drop=True), state)
    finally:
        if key_state is not None:
            key_state.calling(False)
    return output_records(produced, output_columns), len(keys)


def call_vectorized_timers(on_timer: VectorizedTimerFunction,
                           backend: ChangelogKeyedStateBackend, due: Sequence[Timer],
                           key_value: Callable[[bytes], Any], key_state: KeyState,
                           output_columns: Set[str] | None = None) -> list[dict[str, Any]]:
    """Call ``on_timer`` once with the ``due`` timers (in firing order) and the
    :class:`BatchState` of their distinct keys (``key_value`` gives a key's natural value
    from its bytes)."""
    positions: dict[bytes, int] = {}
    key_bytes: list[bytes] = []
    key_groups: list[int] = []
    for timer in due:
        if timer.key not in positions:
            positions[timer.key] = len(key_bytes)
            key_bytes.append(timer.key)
            key_groups.append(timer.key_group)
    timers = pd.DataFrame({"key_index": [positions[t.key] for t in due],
                           "time_ms": [t.time_ms for t in due],
                           "domain": [t.domain.value for t in due]})
    state = BatchState(backend, [key_value(k) for k in key_bytes], key_bytes, key_groups,
                       timers["key_index"].to_numpy(), key_state)
    key_state.calling(True)
    try:
        produced = on_timer(timers, state)
    finally:
        key_state.calling(False)
    return output_records(produced, output_columns)


__all__ = ["BatchState", "BulkTimers", "VectorizedFunction", "VectorizedTimerFunction",
           "call_vectorized", "call_vectorized_timers"]
