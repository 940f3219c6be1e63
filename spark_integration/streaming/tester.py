"""A tester for stateful functions: run a per-key or vectorised function, with its
timers and TTL, on rows in plain Python, with a manual clock and watermark; no Spark
session, no Kafka.

It runs the very code a Spark task runs for a subtask (sorting, the per-key loop or the
vectorised call, late rows, timers, TTL expiry, the snapshot), over the in-memory
changelog storage and one subtask holding every key group, so what passes here behaves
the same in a streaming query. Keys are encoded as the streaming driver encodes them
(``kafka_changelog.keys``) with the key columns' Spark types (given, or taken from the
first row's Python values)::

    tester = StatefulTester(sessionize, "user", ["user", "kind", "events"],
                            on_timer=close_session, event_time=EventTime.of("ts", 0))
    tester.run(pd.DataFrame({"user": ["a"], "ts": [pd.Timestamp("2026-01-01", tz="UTC")]}))
    tester.advance_watermark(pd.Timestamp("2026-01-02", tz="UTC"))
    closed = tester.run()              # a batch without rows: due timers fire
    tester.state("a", SESSION_EVENTS)  # None: the session was closed
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Sequence
from typing import Any

import pandas as pd

from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange, key_group_for_key
from kafka_changelog.keys import encode_key
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.host.acquire import AcquiredBackend
from kafka_changelog.state.host.subtask_backend import StateSource
from kafka_changelog.state.schema.descriptors import StateDescriptor
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

from .batch_time import next_watermark
from .columns import INPUT_COLUMNS, KEY_COLUMN, KEY_GROUP_COLUMN, SUBTASK_COLUMN
from .config import StreamingStateConfig
from .initial_state import INITIAL_COLUMN, INITIAL_PREFIX, InitialStateFunction
from .key_state import BatchContext, EventTime, KeyState, TimerInfo, to_ms
from .metrics import SubtaskMetrics
from .state_declarations import StateDeclarations
from .task import StatefulFunction, SubtaskTask
from .task_time import TaskTime, TimerFunction
from .vectorized import VectorizedFunction, VectorizedTimerFunction

#: Spark types of key values as the tester infers them from Python values.
_INFERRED = ((bool, "boolean"), (int, "bigint"), (float, "double"), (str, "string"),
             (bytes, "binary"), (decimal.Decimal, None), (dt.date, "date"))


def infer_key_type(value: Any) -> str:
    """The Spark type a key column of ``value``'s Python type has (a ``Decimal`` needs its
    precision and scale: pass ``key_types``)."""
    if isinstance(value, pd.Timestamp):
        return "timestamp" if value.tzinfo is not None else "timestamp_ntz"
    item = getattr(value, "item", None)
    if item is not None and not isinstance(value, (str, bytes)):
        value = item()
    if isinstance(value, dt.datetime):
        return "timestamp" if value.tzinfo is not None else "timestamp_ntz"
    for python_type, spark_type in _INFERRED:
        if isinstance(value, python_type):
            if spark_type is None:
                break
            return spark_type
    raise TypeError(f"cannot tell the Spark type of key value {value!r}: pass key_types "
                    "(e.g. ['decimal(10,2)'])")


class StatefulTester:
    """Runs a stateful function batch by batch in process (see the module docstring).

    The processing time starts at ``start`` (default: the epoch) and moves only when
    told (:meth:`set_processing_time`, :meth:`advance`); the watermark follows the event
    times of the batches run, as in a query, or is set (:meth:`advance_watermark`).
    """

    def __init__(self, fn: StatefulFunction | VectorizedFunction,
                 key_column: str | Sequence[str], output_columns: Sequence[str], *,
                 on_timer: TimerFunction | VectorizedTimerFunction | None = None,
                 event_time: EventTime | None = None, vectorized: bool = False,
                 order_by: Sequence[str] = (), key_types: Sequence[str] | None = None,
                 start: Any = 0, max_parallelism: int = 128,
                 states: Sequence[StateDescriptor] = (),
                 dropped_states: Sequence[str] = (),
                 on_initial_state: InitialStateFunction | None = None) -> None:
        self.key_columns = [key_column] if isinstance(key_column, str) else list(key_column)
        self.output_columns = list(output_columns)
        self._fn, self._on_timer, self._event_time = fn, on_timer, event_time
        self._vectorized, self._order_by = vectorized, tuple(order_by)
        self._key_types = list(key_types) if key_types is not None else None
        self._declarations = StateDeclarations.of(states, dropped_states)
        self._on_initial_state = on_initial_state
        self._storage = InMemoryChangelogStorage()
        self.backend = ChangelogKeyedStateBackend(
            self._storage, InMemorySnapshotStore(), "tester",
            KeyGroupRange.of(0, max_parallelism - 1), max_parallelism)
        self._config = StreamingStateConfig("tester", "tester", "in-process:0", parallelism=1,
                                            max_parallelism=max_parallelism,
                                            materialization_interval_s=None)
        self.processing_time_ms = to_ms(start)
        self.watermark_ms: int | None = None
        self.batch_id = 0
        #: The metrics of each batch run, as a query reports them.
        self.metrics: list[SubtaskMetrics] = []

    # -- time ------------------------------------------------------------------------------

    def set_processing_time(self, when: Any) -> None:
        """The processing time of the next batches (never earlier than now)."""
        ms = to_ms(when)
        if ms < self.processing_time_ms:
            raise ValueError(f"processing time cannot go back: {ms} < "
                             f"{self.processing_time_ms}")
        self.processing_time_ms = ms

    def advance(self, by: dt.timedelta | float) -> None:
        """Move the processing time on by a ``timedelta`` or seconds."""
        seconds = by.total_seconds() if isinstance(by, dt.timedelta) else float(by)
        self.set_processing_time(self.processing_time_ms + round(seconds * 1000))

    def advance_watermark(self, when: Any) -> None:
        """Set the watermark of the next batches (it never goes back)."""
        ms = to_ms(when)
        self.watermark_ms = ms if self.watermark_ms is None else max(self.watermark_ms, ms)

    # -- running ---------------------------------------------------------------------------

    def run(self, rows: pd.DataFrame | Sequence[dict[str, Any]] | None = None,
            initial_state: pd.DataFrame | Sequence[dict[str, Any]] | None = None
            ) -> list[dict[str, Any]]:
        """Run one batch of ``rows`` (None or empty: a batch without rows, which still
        fires due timers and expires state); its output rows. ``initial_state``: rows
        given to ``on_initial_state`` before the batch's, as in a new application's first
        batch (only the first batch takes them)."""
        frame = self._frame(rows)
        if initial_state is not None:
            if self._on_initial_state is None:
                raise ValueError("initial_state rows need the tester's on_initial_state")
            if self.batch_id:
                raise ValueError(f"initial_state is for the first batch, not batch "
                                 f"{self.batch_id}")
            initial = self._frame(initial_state)
            if initial is not None:
                initial = initial.rename(columns={
                    c: INITIAL_PREFIX + c for c in initial.columns
                    if c not in self.key_columns and c not in INPUT_COLUMNS})
                initial[INITIAL_COLUMN] = True
                frame = initial if frame is None else pd.concat([frame, initial],
                                                                ignore_index=True)
        context = BatchContext(self.batch_id, self.batch_id + 1, self.processing_time_ms,
                               self.watermark_ms)
        task = SubtaskTask(
            self._config, self._fn, self.key_columns, self._order_by, None, {},
            context.checkpoint_id, self.output_columns, self.batch_id,
            outputs_to_driver=False, vectorized=self._vectorized,
            time=TaskTime(context, self._event_time, self._on_timer,
                          tuple(self._key_types or ())), declarations=self._declarations,
            on_initial_state=self._on_initial_state if initial_state is not None else None)
        outputs, metrics, _ = task.run_function(
            AcquiredBackend(self.backend, StateSource.REATTACHED, 0.0), frame, 0)
        self.backend.notify_checkpoint_complete(context.checkpoint_id)
        self.metrics.append(metrics)
        self.watermark_ms = next_watermark(context, self._event_time, [metrics])
        self.batch_id += 1
        return outputs

    def _frame(self, rows: pd.DataFrame | Sequence[dict[str, Any]] | None
               ) -> pd.DataFrame | None:
        if rows is None:
            return None
        frame = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
        if frame.empty:
            return None
        missing = [c for c in self.key_columns if c not in frame.columns]
        if missing:
            raise ValueError(f"key column(s) {missing} are not columns of the rows "
                             f"({list(frame.columns)})")
        if self._key_types is None:
            first = frame.iloc[0]
            self._key_types = [infer_key_type(first[c]) for c in self.key_columns]
        types = self._key_types
        max_p = self.backend.max_parallelism
        keys = [encode_key(list(values), types, self.key_columns)
                for values in frame[self.key_columns].itertuples(index=False, name=None)]
        frame[KEY_COLUMN] = keys
        frame[KEY_GROUP_COLUMN] = [key_group_for_key(k, max_p) for k in keys]
        frame[SUBTASK_COLUMN] = 0
        return frame

    # -- inspecting ------------------------------------------------------------------------

    def _key_bytes(self, key: Any) -> bytes:
        values = list(key) if isinstance(key, tuple) else [key]
        types = self._key_types or [infer_key_type(v) for v in values]
        return encode_key(values, types, self.key_columns)

    def state(self, key: Any, descriptor: StateDescriptor) -> Any:
        """The state object of ``descriptor`` for ``key`` (at the current processing time:
        what the function would see now)."""
        self.backend.set_processing_time(self.processing_time_ms)
        self.backend.set_current_key(self._key_bytes(key))
        return self.backend.state(descriptor)

    def timers(self, key: Any) -> list[TimerInfo]:
        """``key``'s registered timers (processing time first, each by time)."""
        self.backend.set_current_key(self._key_bytes(key))
        state = KeyState(self.backend)
        state.calling(True)
        try:
            return state.timers.list()
        finally:
            state.calling(False)

    def close(self) -> None:
        """Release the in-memory backend."""
        self.backend.close()
        self._storage.close()

    def __enter__(self) -> StatefulTester:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


__all__ = ["StatefulTester", "infer_key_type"]
