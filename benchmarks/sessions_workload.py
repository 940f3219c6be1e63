"""The sessionization workload of ``bench_sessions``: clicks with an event time, and the
sessions every side must close.

The batches are those of :mod:`benchmarks.stateful_workload` (``generate``: prefill,
warm-up, measured and one restart batch; each warm-up/measured/restart batch drawn from
a new random pool of ``active`` users, so users go quiet and come back), with an event
time per click instead of kind/page/amount: ``ts_ms = T0 + seq * step + 1``, the step
such that a full batch spans :data:`BATCH_SPAN_MS` (10 minutes), so event time moves on
with every batch. A user's session closes :data:`GAP_MS` (30 minutes, three batches)
after its last click: by an event-time timer once the watermark passes it, or by the
user's next click when that comes first.

**The watermark**, on every side: batch *N*'s is the largest event time of the batches
before *N* minus :data:`DELAY_MS` (Spark's, with no-data batches off; ours, by design).
Event times are odd (``T0`` and the step even), :data:`GAP_MS` is even and
:data:`DELAY_MS` odd, so a timer (last click + gap: odd) never equals a watermark
(even): whether a side fires a timer at ``watermark >= t`` or ``> t`` cannot matter.
No click is late (each batch's clicks come after the previous batch's, and the delay
is positive).

Every side emits ``user, start, end, clicks`` per closed session; a session closed
in batch *N* is emitted in batch *N* whichever way it closed (ours and Spark's
operators process a key's rows before its due timers, or close the session on the
click after a gap when the timer did not fire yet: the same batch either way), so
the checksums of each batch's outputs (:data:`CHECKSUM_SQL`) must equal the model's
(:func:`expected_checksums`) batch by batch. The job without timers (``clicks_only``)
closes a session only on the user's next click after a gap.

The per-user counter (all clicks of the user, in a value state with a TTL of a day,
processing time, so that it never expires in a run) and the open session are the
state compared on a sample of users (:func:`expected_state`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from benchmarks.stateful_workload import (
    HASH_MODULUS,
    Batch,
    Checksum,
    in_sample,
)

#: A session closes this long (event time) after its user's last click.
GAP_MS = 30 * 60 * 1000
#: The watermark delay (odd: see the module's docstring).
DELAY_MS = 60_001
#: Event time a full batch spans.
BATCH_SPAN_MS = 10 * 60 * 1000
#: The per-user counter's TTL (processing time; longer than any run).
TTL_MS = 24 * 3600 * 1000
#: Event time of click 0 (even).
T0 = 1_767_225_600_000
COLUMNS = ["user", "seq", "ts_ms"]
INPUT_SCHEMA = "user string, seq long, ts_ms long"
#: The source every side reads: the file's columns and the event time as a timestamp.
SOURCE_SELECT = ["user", "seq", "ts_ms", "timestamp_millis(ts_ms) AS ts"]
OUTPUT_SCHEMA = "user string, start long, end long, clicks long"
#: Outputs of the job with timers, and of the job without them (sessions closed by clicks).
TIMERS, CLICKS_ONLY = "timers", "clicks_only"
#: The checksum of a batch's closed sessions, as a :class:`Checksum` (rows, clicks,
#: summed duration, per-row hash of user, clicks and duration).
CHECKSUM_SQL = (
    "count(*) AS rows",
    "sum(clicks) AS events",
    "sum(`end` - start) AS cents",
    f"sum(pmod(crc32(cast(user AS binary)) * 1000003 + clicks * 7919 + (`end` - start), "
    f"{HASH_MODULUS})) AS hash",
)

#: An open session: start, last click, clicks (event times in ms).
Session = tuple[int, int, int]
#: A user's compared state: clicks counted, and the open session (None when closed).
UserSessionState = list[int | None]


def step_ms(events_per_batch: int) -> int:
    """The (even) event time between two clicks: a full batch spans about
    :data:`BATCH_SPAN_MS`."""
    return max(2, BATCH_SPAN_MS // max(events_per_batch, 1) // 2 * 2)


def with_event_time(batches: Sequence[Batch], step: int) -> list[Batch]:
    """The batches with ``ts_ms`` (odd) instead of the clickstream's columns."""
    return [replace(b, frame=b.frame.assign(ts_ms=T0 + b.frame["seq"] * step + 1)[COLUMNS])
            for b in batches]


def fold_session(times: Sequence[int], session: Session | None
                 ) -> tuple[list[Session], Session | None]:
    """Fold one user's click times (in order) into its open session: the sessions the
    clicks closed (a click more than :data:`GAP_MS` after the last) and the open one."""
    closed: list[Session] = []
    for ts in times:
        if session is not None and ts - session[1] > GAP_MS:
            closed.append(session)
            session = None
        session = (ts, ts, 1) if session is None else (session[0], max(session[1], ts),
                                                       session[2] + 1)
    return closed, session


def _sessions(batches: Sequence[Batch]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every session of the clicks with the batch that closes it (-1: still open at the
    end), with timers and without; and the clicks."""
    data = pd.concat([b.frame.assign(batch=b.index) for b in batches], ignore_index=True)
    data = data.sort_values(["user", "seq"], kind="stable", ignore_index=True)
    ts = data["ts_ms"].to_numpy(np.int64)
    user = data["user"].to_numpy(object)
    first = np.r_[True, user[1:] != user[:-1]]
    new = first | np.r_[False, np.diff(ts) > GAP_MS]
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], len(data)] - 1
    batch = data["batch"].to_numpy(np.int64)
    sessions = pd.DataFrame({"user": user[starts], "start": ts[starts], "end": ts[ends],
                             "clicks": ends - starts + 1})
    # The batch of the user's next click after the session (a new session), if any.
    next_start = np.r_[starts[1:], -1]
    same_user = np.r_[~first[starts[1:]], False]
    next_click = np.where(same_user, batch[next_start], np.iinfo(np.int64).max)
    # Batch N's watermark: the largest event time before N minus the delay.
    max_ts = np.array([int(b.frame["ts_ms"].max()) for b in batches], dtype=np.int64)
    watermark = np.r_[np.iinfo(np.int64).min, max_ts[:-1] - DELAY_MS]
    watermark = np.maximum.accumulate(watermark)
    fire = np.searchsorted(watermark, sessions["end"].to_numpy() + GAP_MS, side="left")
    fire = np.where(fire >= len(batches), np.iinfo(np.int64).max, fire)
    closing = np.minimum(next_click, fire)
    sessions["closed_in"] = np.where(closing == np.iinfo(np.int64).max, -1, closing)
    sessions["closed_by_timer"] = fire < next_click
    sessions["closed_in_clicks_only"] = np.where(
        next_click == np.iinfo(np.int64).max, -1, next_click)
    return sessions, data


def _checksums(closed: pd.DataFrame, column: str, count: int) -> dict[int, Checksum]:
    import zlib

    crc = {u: zlib.crc32(u.encode()) for u in closed["user"].unique()}
    duration = closed["end"] - closed["start"]
    hashes = (closed["user"].map(crc).astype(np.int64) * 1_000_003 + closed["clicks"] * 7919
              + duration) % HASH_MODULUS
    sums = (closed.assign(duration=duration, hash=hashes).groupby(column)
            .agg(rows=("user", "size"), events=("clicks", "sum"),
                 cents=("duration", "sum"), hash=("hash", "sum")))
    found = {i: Checksum(0, 0, 0, 0) for i in range(count)}
    for b, r in sums.iterrows():
        if int(b) >= 0:
            found[int(b)] = Checksum(int(r.rows), int(r.events), int(r.cents),
                                     int(r.hash))
    return found


def expected_checksums(batches: Sequence[Batch]) -> tuple[dict[str, dict[int, Checksum]],
                                                           dict[int, int]]:
    """Per batch, the checksum of the sessions closed in it (with timers, and by clicks
    only); and per batch, how many sessions timers closed."""
    sessions, _ = _sessions(batches)
    by_timer = sessions[sessions["closed_by_timer"] & (sessions["closed_in"] >= 0)]
    timers = {i: 0 for i in range(len(batches))}
    timers.update({int(b): int(n) for b, n in by_timer.groupby("closed_in").size().items()})
    return ({TIMERS: _checksums(sessions, "closed_in", len(batches)),
             CLICKS_ONLY: _checksums(sessions, "closed_in_clicks_only", len(batches))},
            timers)


def expected_state(batches: Sequence[Batch], permille: int
                   ) -> dict[str, dict[str, UserSessionState]]:
    """The final state of the sampled users, with timers and by clicks only: clicks
    counted and the open session (start, last click, clicks; None when closed)."""
    sessions, data = _sessions(batches)
    sampled = sessions[sessions["user"].map(lambda u: in_sample(u, permille))]
    totals = data.groupby("user").size()
    found: dict[str, dict[str, UserSessionState]] = {TIMERS: {}, CLICKS_ONLY: {}}
    for outputs, column in ((TIMERS, "closed_in"), (CLICKS_ONLY, "closed_in_clicks_only")):
        for user, group in sampled.groupby("user"):
            last = group.iloc[-1]
            is_open = int(last[column]) < 0
            found[outputs][str(user)] = user_session_state(
                int(totals[user]),
                (int(last.start), int(last.end), int(last.clicks)) if is_open else None)
    return found


def user_session_state(total: int, session: Session | None) -> UserSessionState:
    """The comparable (and JSON-able) form of a user's state."""
    if session is None:
        return [int(total), None, None, None]
    return [int(total), int(session[0]), int(session[1]), int(session[2])]
