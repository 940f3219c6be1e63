"""Our sides of ``bench_sessions``: the sessions job with ``stateful_foreach_batch``.

Per key (``fn(user, rows, state)``) and vectorised (``fn(rows, state)``, many users per
call), each in three variants, so that the cost of time in state shows:

- ``ours`` / ``ours_vectorized``: the job as :mod:`examples.sessions` writes it: the
  open session in three value states (``examples.sessions.START, LAST, CLICKS``), the
  clicks counted in a value state with a TTL (a day, processing time), an event-time
  timer at the session's end (``EventTime.of("ts", DELAY_MS)``), ``on_timer`` emitting
  the session and clearing it;
- ``..._no_ttl``: the same without the counter's TTL;
- ``..._plain``: the same without TTL and without timers or event time (a session closes
  only on the user's next click after a gap: outputs ``clicks_only``).

All fold a user's clicks of the batch on local variables
(:func:`benchmarks.sessions_workload.fold_session`; vectorised: with numpy over all of a
subtask's rows) and write its state once, as Spark's sides do.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.sessions_workload import (
    CLICKS_ONLY,
    DELAY_MS,
    GAP_MS,
    OUTPUT_SCHEMA,
    TIMERS,
    TTL_MS,
    UserSessionState,
    fold_session,
    user_session_state,
)
from benchmarks.stateful_registry import OURS, RunContext, Side, register
from benchmarks.stateful_sides import _ours_config, ours_state_rows
from examples.sessions import CLICKS, LAST, START, close_session
from kafka_changelog.state.schema.descriptors import StateDescriptor, value_state
from kafka_changelog.state.schema.serializers import INT64
from spark_integration.streaming import EventTime, KeyState, stateful_foreach_batch
from spark_integration.streaming.vectorized import BatchState

SIDES: dict[str, Side] = {}
TOTAL_NAME = "clicks_total"
TOTAL_TTL = value_state(TOTAL_NAME, INT64, ttl=dt.timedelta(milliseconds=TTL_MS))
TOTAL = value_state(TOTAL_NAME, INT64)
SESSION = (START, LAST, CLICKS)


def update_user(total: StateDescriptor, timers: bool, user: str, rows: pd.DataFrame,
                state: KeyState) -> list[dict[str, Any]] | None:
    """One user's clicks of the batch (``seq`` order) into its session and counter."""
    times = rows["ts_ms"].tolist()
    start, last, clicks = (state(d) for d in SESSION)
    previous = last.value()
    before = None if previous is None else (start.value(), previous, clicks.value())
    closed, session = fold_session(times, before)
    if timers and previous is not None:
        state.timers.delete_event_time(previous + GAP_MS)
    if session is None:
        for value in (start, last, clicks):
            value.clear()
    else:
        start.update(session[0])
        last.update(session[1])
        clicks.update(session[2])
        if timers:
            state.timers.register_event_time(session[1] + GAP_MS)
    counter = state(total)
    counter.update((counter.value() or 0) + len(times))
    return [{"user": user, "start": s, "end": e, "clicks": c} for s, e, c in closed] or None


def _column(values: list[Any]) -> np.ndarray:
    return np.array([0 if v is None else v for v in values], dtype=np.int64)


def update_users(total: StateDescriptor, timers: bool, rows: pd.DataFrame,
                 state: BatchState) -> pd.DataFrame | None:
    """All of a subtask's clicks of the batch (sorted by user, then ``seq``) into the
    users' sessions and counters, with numpy."""
    keys = list(state.keys)
    index = np.asarray(state.key_index)
    ts = rows["ts_ms"].to_numpy(np.int64)
    stored_last = state.value(LAST).get(keys)
    has = np.array([v is not None for v in stored_last], dtype=bool)
    st_start, st_last = _column(state.value(START).get(keys)), _column(stored_last)
    st_clicks = _column(state.value(CLICKS).get(keys))
    first = np.r_[True, index[1:] != index[:-1]]
    previous = np.r_[0, ts[:-1]]
    previous[first] = st_last[index[first]]
    breaks = (~first | has[index]) & (ts - previous > GAP_MS)
    seg_rows = np.flatnonzero(first | breaks)
    seg_key = index[seg_rows]
    seg_start = ts[seg_rows].copy()
    seg_end = np.maximum.reduceat(ts, seg_rows)
    seg_clicks = np.diff(np.r_[seg_rows, len(ts)])
    # A key's first segment continues its stored session unless its first click broke it.
    goes_on = first[seg_rows] & has[seg_key] & ~breaks[seg_rows]
    seg_start[goes_on] = st_start[seg_key[goes_on]]
    seg_clicks[goes_on] += st_clicks[seg_key[goes_on]]
    last_of_key = np.r_[seg_key[1:] != seg_key[:-1], True]
    stored_closed = np.flatnonzero(has & np.isin(np.arange(len(keys)),
                                                 index[first & breaks]))
    out = pd.DataFrame({
        "user": [keys[k] for k in stored_closed] + [keys[k] for k in seg_key[~last_of_key]],
        "start": np.r_[st_start[stored_closed], seg_start[~last_of_key]],
        "end": np.r_[st_last[stored_closed], seg_end[~last_of_key]],
        "clicks": np.r_[st_clicks[stored_closed], seg_clicks[~last_of_key]],
    })
    final_start, final_end = seg_start[last_of_key], seg_end[last_of_key]
    if timers:
        state.timers.delete_event_time([keys[k] for k in np.flatnonzero(has)],
                                       (st_last[has] + GAP_MS).tolist())
    state.value(START).set(keys, final_start.tolist())
    state.value(LAST).set(keys, final_end.tolist())
    state.value(CLICKS).set(keys, seg_clicks[last_of_key].tolist())
    if timers:
        state.timers.register_event_time(keys, (final_end + GAP_MS).tolist())
    counter = state.value(total)
    counts = np.bincount(index, minlength=len(keys))
    counter.set(keys, (_column(counter.get(keys)) + counts).tolist())
    return out if len(out) else None


def close_sessions(timers: pd.DataFrame, state: BatchState) -> pd.DataFrame:
    """The due timers' sessions (their end passed): emitted, and cleared."""
    keys = [state.keys[i] for i in timers["key_index"]]
    out = pd.DataFrame({"user": keys, "start": state.value(START).get(keys),
                        "end": state.value(LAST).get(keys),
                        "clicks": state.value(CLICKS).get(keys)})
    for descriptor in SESSION:
        state.value(descriptor).clear(keys)
    return out


def _start(vectorized: bool, ttl: bool, timers: bool, ctx: RunContext) -> Any:
    config = _ours_config(ctx, "rocksdb")
    total = TOTAL_TTL if ttl else TOTAL
    kwargs: dict[str, Any] = {}
    if timers:
        kwargs = {"on_timer": close_sessions if vectorized else close_session,
                  "event_time": EventTime.of("ts", dt.timedelta(milliseconds=DELAY_MS))}
    fn = functools.partial(update_users if vectorized else update_user, total, timers)
    processor = stateful_foreach_batch(config, fn, "user", OUTPUT_SCHEMA, sink=ctx.sink,
                                       order_by=["seq"], vectorized=vectorized, **kwargs)
    ctx.extras["processor"] = processor
    return (ctx.source.writeStream.foreachBatch(processor)
            .option("checkpointLocation", ctx.checkpoint_dir).start())


def _read(ctx: RunContext, permille: int) -> dict[str, UserSessionState]:
    """The sampled users' counter and open session, through our Spark reader."""
    rows = ours_state_rows(ctx, permille, [TOTAL_NAME, *(d.name for d in SESSION)])
    values: dict[str, dict[str, int]] = {}
    for row in rows.itertuples(index=False):
        values.setdefault(row.user, {})[row.state] = int(row.value_decoded)
    return {user: user_session_state(
        got.get(TOTAL_NAME, 0),
        (got[START.name], got[LAST.name], got[CLICKS.name]) if LAST.name in got else None)
        for user, got in values.items()}


for _vectorized, _prefix in ((False, "ours"), (True, "ours_vectorized")):
    _api = "vectorized=True" if _vectorized else "per key"
    register(SIDES, Side(_prefix, f"ours, {_api}: timers and TTL", OURS, TIMERS,
                         functools.partial(_start, _vectorized, True, True), _read))
    register(SIDES, Side(f"{_prefix}_no_ttl", f"ours, {_api}: timers, no TTL", OURS, TIMERS,
                         functools.partial(_start, _vectorized, False, True), _read))
    register(SIDES, Side(f"{_prefix}_plain", f"ours, {_api}: no timers, no TTL", OURS,
                         CLICKS_ONLY, functools.partial(_start, _vectorized, False, False),
                         _read))
