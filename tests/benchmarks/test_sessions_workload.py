"""The sessions benchmark's model (sessions, the batch that closes each, the final state)
agrees with the fold every side uses and with the sessions example's reference."""

from __future__ import annotations

import pandas as pd

from benchmarks.sessions_workload import (
    CLICKS_ONLY,
    DELAY_MS,
    GAP_MS,
    TIMERS,
    expected_checksums,
    expected_state,
    fold_session,
    step_ms,
    with_event_time,
)
from benchmarks.stateful_workload import Batch, WorkloadShape, generate
from examples.sessions import expected_sessions


def _batches() -> list[Batch]:
    shape = WorkloadShape(300, 400, warmup=2, measured=6, active=150, prefill_batches=1)
    return with_event_time(generate(shape), step_ms(shape.events_per_batch))


def test_event_times_never_meet_a_watermark() -> None:
    batches = _batches()
    times = pd.concat(b.frame for b in batches)["ts_ms"]
    assert (times % 2 == 1).all() and GAP_MS % 2 == 0 and DELAY_MS % 2 == 1
    maxima = [int(b.frame["ts_ms"].max()) for b in batches]
    assert all(int(b.frame["ts_ms"].min()) > m - DELAY_MS
               for b, m in zip(batches[1:], maxima, strict=False))


def test_the_fold_gives_the_sessions_of_the_reference() -> None:
    clicks = pd.concat(b.frame for b in _batches()).sort_values("seq")
    folded = []
    for user, rows in clicks.groupby("user"):
        closed, session = fold_session(rows["ts_ms"].tolist(), None)
        assert session is not None
        folded += [(user, *s) for s in [*closed, session]]
    assert sorted(folded) == expected_sessions(
        {"user": u, "ts": t} for u, t in zip(clicks["user"], clicks["ts_ms"], strict=True))


def test_every_session_closes_once_and_the_state_holds_the_open_ones() -> None:
    batches = _batches()
    checksums, due = expected_checksums(batches)
    states = expected_state(batches, 1000)
    clicks = pd.concat(b.frame for b in batches)
    total = len(expected_sessions(
        {"user": u, "ts": t} for u, t in zip(clicks["user"], clicks["ts_ms"], strict=True)))
    for outputs in (TIMERS, CLICKS_ONLY):
        closed = sum(c.rows for c in checksums[outputs].values())
        still_open = sum(1 for s in states[outputs].values() if s[1] is not None)
        assert closed + still_open == total
        assert sum(s[0] for s in states[outputs].values()) == len(clicks)
    assert sum(due.values()) > 0
    assert sum(c.rows for c in checksums[TIMERS].values()) > sum(
        c.rows for c in checksums[CLICKS_ONLY].values())
