"""The input a checkpoint's state holds, as its properties record it."""

from __future__ import annotations

import pytest

from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
from kafka_changelog.state.checkpoints.input_progress import FilesMark, InputProgress
from kafka_changelog.state.checkpoints.source_offsets import SourceOffsetsError
from kafka_changelog.state.history.input_forget import (
    FORGOT_FROM_PROPERTY,
    FORGOT_TOPICS_PROPERTY,
    execute_forget,
    plan_forget,
)
from kafka_changelog.state.history.rewind import RewindError


def test_progress_is_cumulative_and_never_goes_back() -> None:
    start = InputProgress({"a": {0: 10, 1: 5}, "old": {0: 7}},
                          {"file:/in": FilesMark(1000, frozenset({"file:/in/x"}))}, ("s1",))
    after = start.after({"a": {0: 12, 1: 3, 2: 4}}, {"file:/in": {"file:/in/y": 1000,
                                                                  "file:/in/z": 900}},
                        ["s2"])
    # Partition 1 ended below the state's (its rows were skipped): it stays at 5.
    assert after.offsets == {"a": {0: 12, 1: 5, 2: 4}, "old": {0: 7}}
    assert after.files == {"file:/in": FilesMark(1000, frozenset({"file:/in/x",
                                                                  "file:/in/y"}))}
    assert after.sources == ("s2",)
    newer = after.after({}, {"file:/in": {"file:/in/w": 2000}, "file:/b": {"file:/b/1": 5}},
                        [])
    assert newer.files == {"file:/in": FilesMark(2000, frozenset({"file:/in/w"})),
                           "file:/b": FilesMark(5, frozenset({"file:/b/1"}))}
    assert newer.sources == ("s2",)


def test_progress_round_trips_through_properties() -> None:
    progress = InputProgress({"t": {1: 4, 0: 3}},
                             {"file:/d": FilesMark(9, frozenset({"file:/d/b", "file:/d/a"}))},
                             ("KafkaV2[Subscribe[t]]",))
    recorded = progress.properties()
    assert recorded == {
        "spark.source_offsets": '{"t":{"0":3,"1":4}}',
        "spark.source_files": '{"file:/d":{"through_ms":9,"files":["file:/d/a","file:/d/b"]}}',
        "spark.sources": '["KafkaV2[Subscribe[t]]"]'}
    assert InputProgress.of(recorded, "here") == progress
    assert InputProgress.of({}, "here") == InputProgress()
    assert InputProgress().properties() == {}


def test_a_files_mark_holds_older_files_and_named_ones_at_its_time() -> None:
    mark = FilesMark(100, frozenset({"a"}))
    assert mark.holds("z", 99) and mark.holds("a", 100)
    assert not mark.holds("b", 100) and not mark.holds("a", 101)


def test_a_property_not_understood_names_the_checkpoint() -> None:
    with pytest.raises(SourceOffsetsError) as caught:
        InputProgress.of({"spark.source_files": "[1]"}, "checkpoint 3 of application 'x'")
    assert str(caught.value).startswith(
        "checkpoint 3 of application 'x': property spark.source_files should be "
        '{"directory": {"through_ms": ms, "files": [...]}}, got \'[1]\'')


def test_forgetting_a_topic_commits_a_copy_without_its_offsets() -> None:
    store = InMemoryCheckpointStore(retain=10)
    store.commit(CompletedCheckpoint("shop", 4, 1000, 128, (), properties={
        "spark.query_id": "q", "spark.source_offsets": '{"a":{"0":5},"b":{"0":6}}'}))
    with pytest.raises(RewindError) as caught:
        plan_forget(store, "shop", ["c"])
    assert str(caught.value) == ("checkpoint 4 of application 'shop' records no input "
                                 "offsets of topic(s) ['c']; it records those of: a, b")
    plan = plan_forget(store, "shop", ["a"], now_ms=2000)
    execute_forget(store, plan)
    latest = store.latest("shop")
    assert latest is not None and latest.checkpoint_id == 6
    assert latest.properties == {"spark.query_id": "q", "spark.source_offsets": '{"b":{"0":6}}',
                                 FORGOT_TOPICS_PROPERTY: '["a"]', FORGOT_FROM_PROPERTY: "4"}
    with pytest.raises(RewindError, match="application 'none' has no checkpoint"):
        plan_forget(store, "none", ["a"])
