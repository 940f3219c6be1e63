"""The clickstream workload of ``bench_spark_stateful``: batches, files, expected results.

Every side of the benchmark reads the same pre-generated micro-batches: one Parquet
file per batch (columns ``user, seq, kind, page, amount``, the schema of
:mod:`examples.clickstream`), read by a streaming file source with
``maxFilesPerTrigger=1``, so micro-batch *i* of every side is exactly file *i*.

Events follow ``examples.events.events``'s distribution (kinds view/click/purchase at
70/25/5 %, five pages, a purchase spends 1.00-100.00, anything else 0.0), drawn
with numpy so that millions of events take seconds. Amounts are whole cents
divided by 100, so every running total is exact in cents: the expected results are
integers (events, cents) and need no tolerance.

Outputs are checked through a checksum per batch, computed by a Spark aggregate in
each side's sink (:data:`CHECKSUM_SQL`) and here from the events
(:func:`expected_checksums`): rows, sum of events, sum of cents and a sum of
per-row hashes (``crc32(user)``, events, cents), so a total moved from one user to
another is caught too. The final state (events, spent, count per kind, last five
pages) is compared on a sample of users chosen by ``crc32(user) % 1000 <
permille`` (:func:`sample_permille`), a predicate Spark and Python compute alike.
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from examples import events as clicks

#: The input columns and their Spark schema (the file source needs it given).
COLUMNS = ["user", "seq", "kind", "page", "amount"]
INPUT_SCHEMA = "user string, seq long, kind string, page string, amount double"
KINDS = np.array(clicks.KINDS)
KIND_WEIGHTS = [weight / sum(clicks.KIND_WEIGHTS) for weight in clicks.KIND_WEIGHTS]
PAGES = np.array(clicks.PAGES)
PURCHASE = "purchase"
LAST_PAGES = 5

#: Batch kinds, in the order they are fed.
PREFILL, WARMUP, MEASURED, RESTART = "prefill", "warmup", "measured", "restart"

#: Per-row hash of an output row: crc32 of the user's UTF-8 bytes, events, cents.
HASH_MODULUS = 1_000_000_007
CHECKSUM_SQL = (
    "count(*) AS rows",
    "sum(events) AS events",
    "sum(cast(round(spent * 100) AS bigint)) AS cents",
    f"sum(pmod(crc32(cast(user AS binary)) * 1000003 + events * 7919 + "
    f"cast(round(spent * 100) AS bigint), {HASH_MODULUS})) AS hash",
)
#: A sampled user: ``pmod(crc32(user), 1000) < permille``.
SAMPLE_MODULUS = 1000


@dataclass(frozen=True)
class Checksum:
    """The aggregate of one batch's output rows (see :data:`CHECKSUM_SQL`)."""

    rows: int
    events: int
    cents: int
    hash: int

    @staticmethod
    def of_row(row: Any) -> Checksum:
        """From the Spark row :data:`CHECKSUM_SQL` gives (nulls of an empty batch: 0)."""
        return Checksum(int(row["rows"] or 0), int(row["events"] or 0),
                        int(row["cents"] or 0), int(row["hash"] or 0))

    def as_list(self) -> list[int]:
        return [self.rows, self.events, self.cents, self.hash]


@dataclass(frozen=True)
class Batch:
    """One micro-batch of the workload."""

    index: int
    kind: str
    frame: pd.DataFrame

    @property
    def users(self) -> int:
        return int(self.frame["user"].nunique())


@dataclass(frozen=True)
class WorkloadShape:
    """How many users, events and batches of which kind."""

    users: int
    events_per_batch: int
    warmup: int
    measured: int
    #: Users a warm-up/measured/restart batch draws from (a new random sample of
    #: ``active`` users each batch); None: all users.
    active: int | None = None
    #: At most this many prefill batches (each user's first event, before the warm-up),
    #: so that the state holds every user from the first measured batch on.
    prefill_batches: int = 10
    seed: int = 7

    def prefill_count(self) -> int:
        return min(self.prefill_batches, math.ceil(self.users / self.events_per_batch))

    def label(self) -> str:
        active = "" if self.active is None else f", batches over {self.active:,} active"
        return f"{self.users:,} users{active}"


def user_names(ids: np.ndarray) -> np.ndarray:
    """``user-<id>`` for every id."""
    names: np.ndarray = ("user-" + pd.Series(ids).astype(str)).to_numpy(dtype=object)
    return names


def _events(rng: np.random.Generator, ids: np.ndarray, first_seq: int) -> pd.DataFrame:
    count = len(ids)
    kinds = rng.choice(KINDS, size=count, p=KIND_WEIGHTS)
    cents = np.where(kinds == PURCHASE, rng.integers(100, 10_001, size=count), 0)
    return pd.DataFrame({
        "user": user_names(ids),
        "seq": np.arange(first_seq, first_seq + count, dtype=np.int64),
        "kind": kinds.astype(object),
        "page": rng.choice(PAGES, size=count).astype(object),
        "amount": cents / 100.0,
    })


def generate(shape: WorkloadShape) -> list[Batch]:
    """Prefill, warm-up, measured batches and one restart batch (``seq`` runs on)."""
    rng = np.random.default_rng(shape.seed)
    batches: list[Batch] = []
    seq = 0
    prefill = shape.prefill_count()
    for chunk in np.array_split(rng.permutation(shape.users), prefill):
        frame = _events(rng, chunk, seq)
        seq += len(frame)
        batches.append(Batch(len(batches), PREFILL, frame))
    kinds = [WARMUP] * shape.warmup + [MEASURED] * shape.measured + [RESTART]
    for kind in kinds:
        if shape.active is None or shape.active >= shape.users:
            pool = None
        else:
            pool = rng.choice(shape.users, size=shape.active, replace=False)
        picks = rng.integers(0, shape.users if pool is None else len(pool),
                             size=shape.events_per_batch)
        ids = picks if pool is None else pool[picks]
        frame = _events(rng, ids, seq)
        seq += len(frame)
        batches.append(Batch(len(batches), kind, frame))
    return batches


def write_files(batches: Sequence[Batch], directory: Path,
                columns: Sequence[str] = tuple(COLUMNS)) -> list[Path]:
    """One Parquet file per batch (``columns``); modification times one second apart in
    batch order (the file source takes files oldest first)."""
    directory.mkdir(parents=True, exist_ok=True)
    base = 1_700_000_000
    paths = []
    for batch in batches:
        path = directory / f"batch-{batch.index:05d}.parquet"
        batch.frame[list(columns)].to_parquet(path, index=False)
        os.utime(path, (base + batch.index, base + batch.index))
        paths.append(path)
    return paths


def _crc(users: Iterable[str]) -> dict[str, int]:
    return {u: zlib.crc32(u.encode()) for u in users}


def _with_cents(batches: Sequence[Batch]) -> pd.DataFrame:
    frames = [b.frame.assign(batch=b.index) for b in batches]
    data = pd.concat(frames, ignore_index=True).sort_values("seq", kind="stable")
    data["cents"] = (data["amount"] * 100).round().astype(np.int64)
    return data


def _checksums(rows: pd.DataFrame, crc: dict[str, int]) -> dict[int, Checksum]:
    """Per batch: the checksum of rows ``batch, user, events, cents``."""
    hashes = (rows["user"].map(crc).astype(np.int64) * 1_000_003 + rows["events"] * 7919
              + rows["cents"]) % HASH_MODULUS
    grouped = rows.assign(hash=hashes).groupby("batch")
    sums = grouped.agg(rows=("user", "size"), events=("events", "sum"),
                       cents=("cents", "sum"), hash=("hash", "sum"))
    return {int(b): Checksum(int(r.rows), int(r.events), int(r.cents), int(r.hash))
            for b, r in sums.iterrows()}


def expected_checksums(batches: Sequence[Batch]) -> dict[str, dict[int, Checksum]]:
    """Per batch, the checksum of the outputs of a stateful side (``cumulative``: each
    user of the batch with its totals over every batch so far) and of the stateless
    baseline (``batch``: each user of the batch with its totals of that batch only)."""
    data = _with_cents(batches)
    crc = _crc(data["user"].unique())
    per_user = data.groupby("user", sort=False)
    data["cum_events"] = per_user.cumcount() + 1
    data["cum_cents"] = per_user["cents"].cumsum()
    last = data.drop_duplicates(["batch", "user"], keep="last")
    cumulative = last[["batch", "user"]].assign(events=last["cum_events"],
                                                cents=last["cum_cents"])
    local = (data.groupby(["batch", "user"], sort=False)
             .agg(events=("seq", "size"), cents=("cents", "sum")).reset_index())
    return {"cumulative": _checksums(cumulative, crc), "batch": _checksums(local, crc)}


def sample_permille(users: int, sample: int) -> int:
    """The ``permille`` whose users (``crc32(user) % 1000 < permille``) number about
    ``sample`` of ``users``."""
    return max(1, min(SAMPLE_MODULUS, math.ceil(SAMPLE_MODULUS * sample / max(users, 1))))


def in_sample(user: str, permille: int) -> bool:
    return zlib.crc32(user.encode()) % SAMPLE_MODULUS < permille


def sample_sql(column: str, permille: int) -> str:
    """Spark SQL predicate of :func:`in_sample` on a string column."""
    return f"pmod(crc32(cast({column} AS binary)), {SAMPLE_MODULUS}) < {permille}"


#: One user's state as compared: events, cents, sorted (kind, count) pairs, last pages.
UserState = list[Any]


def user_state(events: int, spent: float | None, kinds: dict[str, int],
               pages: Sequence[str]) -> UserState:
    """The comparable (and JSON-able) form of a user's state."""
    cents = 0 if spent is None else round(spent * 100)
    return [int(events), int(cents), sorted([str(k), int(v)] for k, v in kinds.items()),
            [str(p) for p in pages]]


def expected_state(batches: Sequence[Batch], permille: int) -> dict[str, UserState]:
    """The final state of the sampled users, computed from every batch's events."""
    data = _with_cents(batches)
    data = data[data["user"].map(lambda u: in_sample(u, permille))]
    found: dict[str, UserState] = {}
    kinds = data.groupby(["user", "kind"]).size()
    pages = data.groupby("user")["page"].apply(lambda s: list(s.iloc[-LAST_PAGES:]))
    totals = data.groupby("user").agg(events=("seq", "size"), cents=("cents", "sum"))
    for user, row in totals.iterrows():
        counts = {str(k): int(v) for k, v in kinds.loc[user].items()}
        found[str(user)] = [int(row.events), int(row.cents),
                            sorted([k, v] for k, v in counts.items()), pages.loc[user]]
    return found


def state_problems(expected: dict[str, UserState], got: dict[str, UserState],
                   limit: int = 3) -> list[str]:
    """What differs between two states of the sample (empty: equal)."""
    problems = []
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(u for u in set(expected) & set(got) if expected[u] != got[u])
    if missing:
        problems.append(f"{len(missing)} users missing, e.g. {missing[:limit]}")
    if extra:
        problems.append(f"{len(extra)} users not expected, e.g. {extra[:limit]}")
    if wrong:
        examples = [f"{u}: {got[u]} != {expected[u]}" for u in wrong[:limit]]
        problems.append(f"{len(wrong)} users differ, e.g. {'; '.join(examples)}")
    return problems
