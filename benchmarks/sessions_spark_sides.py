"""Spark's sides of ``bench_sessions``: its own operators on the sessions workload.

Importable with nothing but PySpark, pandas and the benchmark's workload modules: the
same sides run on the project's pinned PySpark and on the newest release (a separate
virtualenv, ``benchmarks/spark_newest_venv.sh``).

- ``spark_apply_in_pandas_with_state``: ``groupBy("user").applyInPandasWithState`` with
  ``GroupStateTimeout.EventTimeTimeout``: the state is the open session and the clicks
  counted (``clicks == 0``: no open session; the operator has no TTL, the counter is a
  plain field); the timeout timestamp is the session's end; a timed-out call emits the
  session and keeps the counter.
- ``spark_transform_with_state``: ``groupBy("user").transformWithStateInPandas`` with
  ``timeMode="EventTime"``: a ``ValueState`` for the session, a ``ValueState`` for the
  counter, an event-time timer per open session (``registerTimer`` / ``deleteTimer``),
  ``handleExpiredTimer`` emitting the session. The counter has no TTL: Spark refuses a
  TTL in ``timeMode="EventTime"`` (``STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL``
  in 4.2.0 and 4.3.0: TTL needs ``ProcessingTime``, whose timers are processing time), so
  neither of Spark's operators can hold TTL'd state beside event-time timers.

Both read a user's state once per batch, fold its clicks on local variables
(:func:`benchmarks.sessions_workload.fold_session`) and write the state once. The input
has ``withWatermark("ts", DELAY_MS)``; the session turns no-data batches off (see
:mod:`benchmarks.sessions_workload` on the watermark).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from benchmarks.sessions_workload import (
    DELAY_MS,
    GAP_MS,
    OUTPUT_SCHEMA,
    TIMERS,
    Session,
    UserSessionState,
    fold_session,
    user_session_state,
)
from benchmarks.stateful_registry import SPARK, RunContext, Side, protobuf_unavailable, register
from benchmarks.stateful_workload import sample_sql

SIDES: dict[str, Side] = {}
APPLY_STATE_SCHEMA = "start long, last long, clicks long, total long"
OUTPUT_COLUMNS = ["user", "start", "end", "clicks"]


def _times(frames: Iterator[pd.DataFrame]) -> list[int]:
    """A user's click times of the batch, in ``seq`` order."""
    parts = list(frames)
    rows = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    times: list[int] = rows.sort_values("seq", kind="stable")["ts_ms"].tolist()
    return times


def sessions_frame(user: str, sessions: Sequence[Session]) -> pd.DataFrame:
    """Output rows of closed sessions."""
    return pd.DataFrame([(user, *s) for s in sessions], columns=OUTPUT_COLUMNS)


def _watermarked(ctx: RunContext) -> Any:
    return ctx.source.withWatermark("ts", f"{DELAY_MS} milliseconds")


def _sink(ctx: RunContext, out: Any) -> Any:
    return (out.writeStream.outputMode("update").foreachBatch(ctx.sink)
            .option("checkpointLocation", ctx.checkpoint_dir).start())


# --- applyInPandasWithState -------------------------------------------------------


def apply_sessions(key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
                   ) -> Iterator[pd.DataFrame]:
    """One user's clicks of the batch, or its timeout (the session's end passed)."""
    (user,) = key
    start, last, clicks, total = state.get if state.exists else (0, 0, 0, 0)
    if state.hasTimedOut:
        state.update((0, 0, 0, total))
        yield sessions_frame(user, [(start, last, clicks)])
        return
    times = _times(frames)
    closed, session = fold_session(times, (start, last, clicks) if clicks else None)
    total += len(times)
    if session is None:
        state.update((0, 0, 0, total))
    else:
        state.update((*session, total))
        state.setTimeoutTimestamp(session[1] + GAP_MS)
    if closed:
        yield sessions_frame(user, closed)


def _start_apply(ctx: RunContext) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout

    out = _watermarked(ctx).groupBy("user").applyInPandasWithState(
        apply_sessions, OUTPUT_SCHEMA, APPLY_STATE_SCHEMA, "update",
        GroupStateTimeout.EventTimeTimeout)
    return _sink(ctx, out)


def _read_apply(ctx: RunContext, permille: int) -> dict[str, UserSessionState]:
    rows = (ctx.spark.read.format("statestore").load(ctx.checkpoint_dir)
            .where(sample_sql("key.user", permille))
            .selectExpr("key.user AS user", "value.groupState.*").toPandas())
    return {r.user: user_session_state(r.total, (r.start, r.last, r.clicks) if r.clicks
                                       else None)
            for r in rows.itertuples(index=False)}


register(SIDES, Side("spark_apply_in_pandas_with_state",
                     "Spark applyInPandasWithState (EventTimeTimeout)", SPARK, TIMERS,
                     _start_apply, _read_apply))


# --- transformWithStateInPandas ---------------------------------------------------


class SessionsProcessor(StatefulProcessor):
    """Per user: the open session (``ValueState``), the clicks counted (``ValueState``
    with a TTL), an event-time timer at the session's end."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", "start long, last long, clicks long")
        # No TTL: Spark refuses one in timeMode="EventTime"
        # (STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL, 4.2.0 and 4.3.0).
        self.total = handle.getValueState("total", "value long")

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        (user,) = key
        times = _times(rows)
        got = self.session.get()
        before: Session | None = tuple(got) if got is not None else None
        closed, session = fold_session(times, before)
        if before is not None:
            self.handle.deleteTimer(before[1] + GAP_MS)
        if session is None:
            self.session.clear()
        else:
            self.session.update(session)
            self.handle.registerTimer(session[1] + GAP_MS)
        total = self.total.get()
        self.total.update(((total[0] if total is not None else 0) + len(times),))
        if closed:
            yield sessions_frame(user, closed)

    def handleExpiredTimer(self, key: tuple[Any, ...], timerValues: Any,
                           expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        (user,) = key
        got = self.session.get()
        if got is not None:
            self.session.clear()
            yield sessions_frame(user, [tuple(got)])

    def close(self) -> None:
        pass


def _start_transform(ctx: RunContext) -> Any:
    out = _watermarked(ctx).groupBy("user").transformWithStateInPandas(
        SessionsProcessor(), OUTPUT_SCHEMA, "Update", "EventTime")
    return _sink(ctx, out)


def _read_transform(ctx: RunContext, permille: int) -> dict[str, UserSessionState]:
    def read(var: str) -> Any:
        return (ctx.spark.read.format("statestore").option("stateVarName", var)
                .load(ctx.checkpoint_dir).where(sample_sql("key.user", permille)))

    totals = read("total").selectExpr("key.user AS user", "value.value AS v").toPandas()
    sessions = read("session").selectExpr("key.user AS user", "value.*").toPandas()
    open_of = {r.user: (r.start, r.last, r.clicks) for r in sessions.itertuples(index=False)}
    return {u: user_session_state(int(t), open_of.get(u))
            for u, t in zip(totals["user"], totals["v"], strict=True)}


register(SIDES, Side("spark_transform_with_state",
                     "Spark transformWithStateInPandas (EventTime)", SPARK, TIMERS,
                     _start_transform, _read_transform, protobuf_unavailable))
