"""The Spark stateful benchmark's expected results agree with the clickstream job's own
reference (``clickstream.expected_state``), and its side registry behaves."""

from __future__ import annotations

import zlib

import pandas as pd
import pytest

from benchmarks.bench_spark_stateful import parse_cases
from benchmarks.stateful_sides import SIDES, fold_rows
from benchmarks.stateful_workload import (
    HASH_MODULUS,
    MEASURED,
    PREFILL,
    RESTART,
    Checksum,
    WorkloadShape,
    expected_checksums,
    expected_state,
    generate,
    state_problems,
    user_state,
)
from examples.clickstream import expected_state as reference_state


def test_batches_prefill_every_user_then_draw_from_the_active_sample() -> None:
    batches = generate(WorkloadShape(500, 200, warmup=1, measured=3, active=50))
    kinds = [b.kind for b in batches]
    assert kinds[:3] == [PREFILL] * 3 and kinds[-1] == RESTART and kinds.count(MEASURED) == 3
    assert set(pd.concat(b.frame for b in batches[:3])["user"]) == {
        f"user-{i}" for i in range(500)}
    assert all(b.users <= 50 for b in batches[3:])
    seqs = pd.concat(b.frame for b in batches)["seq"].tolist()
    assert seqs == list(range(len(seqs)))


def test_expected_checksums_and_state_match_the_clickstream_reference() -> None:
    batches = generate(WorkloadShape(120, 400, warmup=1, measured=2))
    every = pd.concat(b.frame for b in batches).to_dict("records")
    reference = reference_state(iter(every))
    state = expected_state(batches, permille=1000)
    assert set(state) == set(reference)
    for user, s in reference.items():
        assert state[user] == user_state(s["events"], s["spent"], s["kinds"], s["last_pages"])
    # The last batch's cumulative checksum, from the reference's final totals.
    users = set(batches[-1].frame["user"])
    cents = {u: round(reference[u]["spent"] * 100) for u in users}
    want = Checksum(
        len(users), sum(reference[u]["events"] for u in users), sum(cents.values()),
        sum((zlib.crc32(u.encode()) * 1_000_003 + reference[u]["events"] * 7919 + cents[u])
            % HASH_MODULUS for u in users))
    assert expected_checksums(batches)["cumulative"][batches[-1].index] == want


def test_state_problems_names_the_wrong_user() -> None:
    right = {"user-1": [3, 150, [["view", 3]], ["home"]]}
    assert state_problems(right, right) == []
    wrong = {"user-1": [4, 150, [["view", 3]], ["home"]]}
    assert "user-1" in state_problems(right, wrong)[0]


def test_fold_rows_rounds_like_update_user() -> None:
    rows = pd.DataFrame({"seq": [1, 2, 3], "kind": ["purchase", "view", "purchase"],
                         "page": ["a", "b", "c"], "amount": [0.1, 0.0, 0.2]})
    assert fold_rows(rows, 0, None, {}, ["x"] * 5) == (
        3, 0.3, {"purchase": 2, "view": 1}, ["x", "x", "a", "b", "c"])


def test_cases_and_registry() -> None:
    assert parse_cases("10000, 1000000:10000") == [(10000, None), (1000000, 10000)]
    with pytest.raises(SystemExit):
        parse_cases("many")
    assert list(SIDES)[:3] == ["stateless", "ours_memory", "ours_rocksdb"]
    vectorized = SIDES["ours_vectorized"].unavailable()
    assert vectorized is None or vectorized.startswith("not available")
