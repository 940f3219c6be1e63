"""A batch's input against the input its base checkpoint's state holds (no Spark)."""

from __future__ import annotations

import pytest

from kafka_changelog.state.checkpoints.input_progress import FilesMark, InputProgress
from spark_integration.streaming.batch_input import (
    BatchInput,
    BatchSource,
    SourceKind,
    source_kind,
)
from spark_integration.streaming.input_check import (
    BatchWhere,
    InputOffsetsError,
    InputPolicy,
    check_input,
    check_rerun,
    skip_condition,
)

KAFKA = "KafkaV2[Subscribe[t]]"
STATE = InputProgress({"t": {0: 10, 1: 20}}, {}, (KAFKA,))


def kafka(start: dict[int, int], end: dict[int, int]) -> BatchInput:
    return BatchInput((BatchSource(KAFKA, SourceKind.KAFKA, {"t": start}, {"t": end}),),
                      known=True)


def where(same_query: bool = False, ticks: bool = False) -> BatchWhere:
    return BatchWhere("shop", "q2", 0, 7, same_query, ticks)


def test_sources_are_told_by_their_description() -> None:
    assert source_kind("KafkaV2[Subscribe[t]]") is SourceKind.KAFKA
    assert source_kind("FileStreamSource[file:/in]") is SourceKind.FILES
    assert source_kind("RatePerMicroBatchStream[rowsPerBatch=1]") is SourceKind.OTHER


def test_input_that_continues_the_state_is_recorded_on_top_of_it() -> None:
    checked = check_input(where(), STATE, kafka({0: 10, 1: 20}, {0: 15, 1: 22}),
                          InputPolicy())
    assert checked.skip == {}
    assert checked.progress.offsets == {"t": {0: 15, 1: 22}}


def test_a_re_read_is_refused_naming_every_partition_and_the_fix() -> None:
    with pytest.raises(InputOffsetsError) as caught:
        check_input(where(), STATE, kafka({0: 0, 1: 20}, {0: 15, 1: 25}), InputPolicy())
    assert str(caught.value) == (
        "application 'shop': batch 0 of Spark query q2 would apply input again that the "
        "state (checkpoint 7) already holds: source KafkaV2[Subscribe[t]]: topic t "
        "partition 0: the batch starts at 0, the state holds up to 10. That checkpoint "
        "was committed by another query: a second deployment of the application, a fresh "
        "or copied checkpointLocation, or an old one after a rewind. Nothing was written. "
        "To continue the state exactly, start the query with a fresh checkpointLocation "
        "and .option(\"startingOffsets\", spark_integration.starting_offsets(config)) "
        "(here: {\"t\":{\"0\":10,\"1\":20}}), or set "
        "StreamingStateConfig(skip_applied_input=True) to drop the rows the state holds "
        "(the rows need the Kafka source's columns topic, partition, offset). If t was "
        "deleted and created again: kafka-changelog input-offsets shop --forget t --yes.")


def test_skipping_drops_what_the_state_holds_and_keeps_its_offsets() -> None:
    checked = check_input(where(), STATE, kafka({0: 0, 1: 20}, {0: 8, 1: 25}),
                          InputPolicy(skip_applied_input=True))
    assert checked.skip == {("t", 0): 10}
    assert checked.progress.offsets == {"t": {0: 10, 1: 25}}


def test_a_gap_is_refused_unless_allowed() -> None:
    batch = kafka({0: 12, 1: 20}, {0: 15, 1: 20})
    with pytest.raises(InputOffsetsError, match=r"would skip input the state .checkpoint 7. "
                       r"never saw: source KafkaV2.Subscribe.t..: topic t partition 0: the "
                       r"batch starts at 12, the state holds up to 10"):
        check_input(where(), STATE, batch, InputPolicy())
    checked = check_input(where(), STATE, batch, InputPolicy(allow_input_gaps=True))
    assert checked.progress.offsets == {"t": {0: 15, 1: 20}}


def test_another_topic_is_new_input() -> None:
    other = BatchInput((BatchSource("KafkaV2[Subscribe[u]]", SourceKind.KAFKA, {},
                                    {"u": {0: 5}}),), known=True)
    checked = check_input(where(), STATE, other, InputPolicy())
    assert checked.progress.offsets == {"t": {0: 10, 1: 20}, "u": {0: 5}}


def test_a_new_partition_of_a_recorded_topic_read_from_earliest_is_a_re_read() -> None:
    state = InputProgress({"t": {0: 10, 2: 3}})
    with pytest.raises(InputOffsetsError, match="partition 2: the batch starts at its "
                       "earliest offset, the state holds up to 3"):
        check_input(where(), state, kafka({0: 10}, {0: 10, 2: 3}), InputPolicy())


def test_files_the_state_holds_are_refused_for_another_query_only() -> None:
    state = InputProgress({}, {"file:/in": FilesMark(100, frozenset({"file:/in/a"}))})
    batch = BatchInput((BatchSource("FileStreamSource[file:/in]", SourceKind.FILES,
                                    directory="file:/in",
                                    files={"file:/in/a": 100, "file:/in/b": 100}),),
                       known=True)
    with pytest.raises(InputOffsetsError) as caught:
        check_input(where(), state, batch, InputPolicy())
    assert "would apply files again that the state (checkpoint 7) already holds: " \
           "file:/in/a (modified at 100 ms). The state holds file:/in: files modified " \
           "before 100 ms, and ['file:/in/a'] at it." in str(caught.value)
    checked = check_input(where(same_query=True), state, batch, InputPolicy())
    assert checked.progress.files == {
        "file:/in": FilesMark(100, frozenset({"file:/in/a", "file:/in/b"}))}
    assert checked.skip_files == frozenset()
    skipping = check_input(where(), state, batch, InputPolicy(skip_applied_input=True))
    assert skipping.skip_files == {"file:/in/a"}
    assert skipping.progress == checked.progress
    # A query that skipped the held files goes on skipping them in its next batches.
    going_on = check_input(where(same_query=True), state, batch,
                           InputPolicy(skip_applied_input=True))
    assert going_on.skip_files == {"file:/in/a"}


def test_a_source_that_cannot_be_compared_is_refused_when_a_new_query_restarts_it() -> None:
    rate = "RatePerMicroBatchStream[rowsPerBatch=5]"
    state = InputProgress({}, {}, (rate,))
    batch = BatchInput((BatchSource(rate, SourceKind.OTHER),), known=True)
    with pytest.raises(InputOffsetsError, match=r"reads RatePerMicroBatchStream.rowsPerBatch=5., "
                       r"a source whose progress cannot be compared"):
        check_input(where(), state, batch, InputPolicy())
    check_input(where(), state, batch, InputPolicy(allow_uncompared_sources=True))
    check_input(where(same_query=True), state, batch, InputPolicy())
    check_input(where(ticks=True), state, batch, InputPolicy())  # the ticks' source


def test_an_unknown_input_keeps_the_recorded_progress() -> None:
    checked = check_input(where(), STATE, BatchInput(), InputPolicy())
    assert checked.progress == STATE and checked.skip == {}


def test_skipping_needs_the_kafka_columns() -> None:
    with pytest.raises(InputOffsetsError) as caught:
        skip_condition({("t", 0): 10}, ["user", "offset"])
    assert str(caught.value) == (
        "skip_applied_input drops the Kafka rows the state already holds by their topic, "
        "partition, offset columns, but the batch's rows have no column(s) ['topic', "
        "'partition'] (they have ['user', 'offset']): keep the Kafka source's columns "
        "topic, partition, offset in the stream given to foreachBatch.")


def test_a_re_run_must_read_the_committed_batch_s_input() -> None:
    committed = InputProgress({"t": {0: 10, 1: 20}},
                              {"file:/in": FilesMark(100, frozenset({"file:/in/a"}))})
    check_rerun(where(same_query=True), 7, committed, kafka({0: 5, 1: 15}, {0: 10, 1: 20}))
    with pytest.raises(InputOffsetsError) as caught:
        check_rerun(where(same_query=True), 7, committed,
                    kafka({0: 5, 1: 15}, {0: 12, 1: 20}))
    assert str(caught.value).startswith(
        "application 'shop': batch 0 of Spark query q2 runs again the batch that committed "
        "checkpoint 7, but not over the same input: topic t partition 0: this run reads up "
        "to 12, the committed batch read up to 10. Its checkpointLocation is a copy")
    files = BatchInput((BatchSource("FileStreamSource[file:/in]", SourceKind.FILES,
                                    directory="file:/in",
                                    files={"file:/in/a": 100, "file:/in/b": 100}),),
                       known=True)
    with pytest.raises(InputOffsetsError, match=r"file file:/in/b .modified at 100 ms., "
                       "which the committed batch did not read"):
        check_rerun(where(same_query=True), 7, committed, files)
