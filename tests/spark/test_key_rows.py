"""KeyRows: the per-key call's rows give exactly pandas' itertuples (no Spark needed)."""

from __future__ import annotations

import datetime
import decimal
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_integration.streaming.key_rows import KeyRows

FRAMES: dict[str, pd.DataFrame] = {
    "mixed with nulls": pd.DataFrame({
        "user": ["a", "b", None], "seq": [1, 2, 3], "amount": [1.5, np.nan, 2.0],
        "ok": [True, False, True]}),
    "times": pd.DataFrame({
        "naive": pd.to_datetime(["2024-01-01", "2024-01-02", None]),
        "utc": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03"]).tz_localize("UTC"),
        "delta": pd.to_timedelta([1, 2, 3], unit="s")}),
    "extension dtypes": pd.DataFrame({
        "category": pd.Categorical(["x", "y", "x"]),
        "nullable int": pd.array([1, None, 3], dtype="Int64"),
        "arrow string": pd.array(["p", None, "q"], dtype="string[pyarrow]"),
        "decimal": [decimal.Decimal("1.10"), decimal.Decimal("2"), None]}),
    "labels that are not identifiers": pd.DataFrame([[1, 2, 3, 4]],
                                                    columns=["a b", 0, "class", "_x"]),
    "duplicate labels": pd.DataFrame([[1, 2], [3, 4]], columns=["a", "a"]),
    "datetime index": pd.DataFrame({"v": [1, 2]},
                                   index=pd.to_datetime(["2024-01-01", "2024-01-02"])),
    "multi index": pd.DataFrame({"v": [1, 2]},
                                index=pd.MultiIndex.from_tuples([("a", 1), ("b", 2)])),
    "no rows": pd.DataFrame({"v": pd.Series([], dtype="int64")}),
    "no columns": pd.DataFrame(index=[1, 2]),
    "other scalars": pd.DataFrame({
        "date": [datetime.date(2024, 1, 1)], "bytes": [b"\x00x"],
        "uint8": np.array([3], dtype=np.uint8), "float32": np.array([1.25], dtype=np.float32)}),
}
CALLS: list[dict[str, Any]] = [{}, {"index": False}, {"name": None},
                               {"index": False, "name": "Row"}]


def _same(expected: list[Any], found: list[Any]) -> None:
    """Equal tuples, of the same class and fields, holding values of the same types
    (NaN equal to NaN)."""
    assert len(found) == len(expected)
    for want, got in zip(expected, found, strict=True):
        assert type(got).__name__ == type(want).__name__
        assert getattr(got, "_fields", None) == getattr(want, "_fields", None)
        assert [type(v) for v in got] == [type(v) for v in want]
        for a, b in zip(want, got, strict=True):
            nan = isinstance(a, float) and math.isnan(a)
            assert (nan and math.isnan(b)) or a is b or a == b, (want, got)


@pytest.mark.parametrize("call", CALLS, ids=repr)
@pytest.mark.parametrize("name", list(FRAMES))
def test_itertuples_gives_what_pandas_gives(name: str, call: dict[str, Any]) -> None:
    frame = FRAMES[name]
    _same(list(frame.itertuples(**call)), list(KeyRows(frame, copy=True).itertuples(**call)))


def test_changes_to_the_rows_show_in_itertuples() -> None:
    rows = KeyRows(FRAMES["mixed with nulls"], copy=True)
    rows.loc[0, "seq"] = 99
    rows["extra"] = "e"
    rows.drop(columns=["ok"], inplace=True)
    rows.sort_values("seq", inplace=True)
    assert repr(list(rows.itertuples(index=False))) == (
        "[Pandas(user='b', seq=2, amount=nan, extra='e'), "
        "Pandas(user=None, seq=3, amount=2.0, extra='e'), "
        "Pandas(user='a', seq=99, amount=1.5, extra='e')]")
    _same(list(pd.DataFrame(rows).itertuples()), list(rows.itertuples()))


def test_frames_made_from_it_are_plain_dataframes() -> None:
    rows = KeyRows(FRAMES["mixed with nulls"], copy=True)
    assert isinstance(rows, pd.DataFrame)
    for derived in (rows[rows["seq"] > 1], rows.copy(), rows.sort_values("seq"),
                    rows.iloc[:1], rows.assign(x=1), rows.head(2)):
        assert type(derived) is pd.DataFrame
    assert type(rows["seq"] * 2) is pd.Series


def test_a_copy_leaves_the_batch_alone() -> None:
    batch = pd.DataFrame({"v": [1, 2, 3]})
    rows = KeyRows(batch.iloc[1:], copy=True)
    rows.loc[1, "v"] = 7
    assert batch["v"].tolist() == [1, 2, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=3)),
                          st.integers(-2**63, 2**63 - 1),
                          st.one_of(st.floats(allow_nan=True), st.none()),
                          st.booleans()), max_size=6),
       st.booleans())
def test_itertuples_matches_pandas_on_any_rows(
        values: list[tuple[Any, ...]], index: bool) -> None:
    frame = pd.DataFrame(values, columns=["text", "number", "real", "flag"])
    _same(list(frame.itertuples(index=index)),
          list(KeyRows(frame, copy=True).itertuples(index=index)))


def test_a_per_key_call_gets_its_rows_as_key_rows_in_order() -> None:
    """What ``stateful_foreach_batch``'s task hands the function (run in process over the
    in-memory changelog storage: no Spark, no broker)."""
    from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange, key_group_for_key
    from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
    from kafka_changelog.state.host.acquire import AcquiredBackend
    from kafka_changelog.state.host.subtask_backend import StateSource
    from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore
    from spark_integration.streaming import StreamingStateConfig
    from spark_integration.streaming.columns import (
        KEY_COLUMN,
        KEY_GROUP_COLUMN,
        SUBTASK_COLUMN,
    )
    from spark_integration.streaming.task import SubtaskTask

    seen: dict[str, tuple[type, list[tuple[Any, ...]]]] = {}

    def per_user(key: str, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
        seen[key] = (type(rows), [tuple(r) for r in rows.itertuples(index=False)])
        rows.loc[rows.index[0], "seq"] = -1  # the function may change its copy
        return []

    users = ["b", "a", "b", "a", "b"]
    batch = pd.DataFrame({"user": users, "seq": [5, 4, 3, 2, 1],
                          "amount": [0.5, 1.0, 1.5, 2.0, 2.5]})
    batch[KEY_COLUMN] = [u.encode() for u in users]
    batch[KEY_GROUP_COLUMN] = [key_group_for_key(u.encode(), 128) for u in users]
    batch[SUBTASK_COLUMN] = 0
    storage = InMemoryChangelogStorage()
    backend = ChangelogKeyedStateBackend(storage, InMemorySnapshotStore(), "op",
                                         KeyGroupRange.of(0, 127), 128)
    config = StreamingStateConfig("app", "op", "unused:9092", parallelism=1,
                                  max_parallelism=128, materialization_interval_s=None)
    task = SubtaskTask(config, per_user, ["user"], ("seq",), None, {}, 1, ["user"], 0)
    try:
        task.run_function(AcquiredBackend(backend, StateSource.FRESH, 0.0), batch, 0)
    finally:
        backend.close()
        storage.close()
    assert seen == {"a": (KeyRows, [("a", 2, 2.0), ("a", 4, 1.0)]),
                    "b": (KeyRows, [("b", 1, 2.5), ("b", 3, 1.5), ("b", 5, 0.5)])}
    assert batch["seq"].tolist() == [5, 4, 3, 2, 1]


@pytest.mark.parametrize("through_manager", [True, False], ids=["manager", "iloc"])
@pytest.mark.parametrize("name", [n for n in FRAMES
                                  if len(FRAMES[n]) >= 2 and len(FRAMES[n].columns)])
def test_copy_of_rows_is_a_copy_of_those_rows(name: str, through_manager: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import spark_integration.streaming.key_rows as key_rows

    monkeypatch.setattr(key_rows, "_SLICE_MANAGER", through_manager and
                        key_rows._manager_slice_works())
    frame = FRAMES[name].copy()
    rows = KeyRows.copy_of_rows(frame, 1, len(frame))
    expected = frame.iloc[1:]
    assert type(rows) is KeyRows and rows.equals(expected)
    assert list(rows.index) == list(expected.index)
    assert list(rows.dtypes) == list(expected.dtypes)
    _same(list(expected.itertuples()), list(rows.itertuples()))
    before = repr(frame)
    rows.iloc[0, 0] = rows.iloc[-1, 0]
    assert repr(frame) == before  # the batch's rows stay as they were


def test_this_pandas_slices_through_its_block_manager() -> None:
    """The faster slicing is in use with the pandas the project pins (2.x)."""
    import spark_integration.streaming.key_rows as key_rows

    assert key_rows._SLICE_MANAGER
