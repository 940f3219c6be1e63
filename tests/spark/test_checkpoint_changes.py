"""What one checkpoint committed, from handles alone: the diff of consecutive checkpoints'
changelog handles, feed options and filter selections (no broker, no Spark session)."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan

from kafka_changelog.kafka.handle import KafkaChangelogHandle, PartitionRange
from kafka_changelog.keygroups import KeyGroupRange, key_group_for_key
from kafka_changelog.keys import encode_key
from spark_integration.reader.checkpoint_changes import Piece, new_pieces, selected_runs, subtract
from spark_integration.reader.feed_planning import parse_feed_options
from spark_integration.reader.planning import ReaderOptionError
from spark_integration.reader.pushdown import KeySelection, key_bytes_of_text, select

KG = KeyGroupRange


def handle(log: str, groups: KeyGroupRange, first: int, last: int,
           ranges: list[tuple[int, int, int, KeyGroupRange]], meta: int | None = 0
           ) -> KafkaChangelogHandle:
    return KafkaChangelogHandle(log, "t", groups, [PartitionRange(p, s, e, g, 10)
                                                   for p, s, e, g in ranges], first, last, meta)


def test_subtract_leaves_the_uncovered_intervals() -> None:
    assert subtract(0, 10, []) == [(0, 10)]
    assert subtract(0, 10, [(0, 4)]) == [(5, 10)]
    assert subtract(0, 10, [(3, 4), (0, 1), (8, 20)]) == [(2, 2), (5, 7)]
    assert subtract(5, 10, [(0, 10)]) == []
    assert subtract(5, 4, []) == []


def test_a_cumulative_handle_yields_what_follows_its_predecessor_from_its_end_offsets() -> None:
    before = handle("L", KG(0, 63), 0, 9, [(0, 0, 40, KG(0, 63))])
    now = handle("L", KG(0, 63), 0, 15, [(0, 0, 70, KG(0, 63))])
    assert new_pieces(now, [before]) == [Piece(KG(0, 63), 10, 15, True, {0: 40})]


def test_a_materialization_between_moves_the_start_past_the_old_end() -> None:
    before = handle("L", KG(0, 63), 0, 9, [(0, 0, 40, KG(0, 63))])
    now = handle("L", KG(0, 63), 7, 15, [(0, 30, 70, KG(0, 63))])
    assert new_pieces(now, [before]) == [Piece(KG(0, 63), 10, 15, True, {0: 40})]


def test_a_new_log_and_the_first_checkpoint_are_all_new() -> None:
    now = handle("N", KG(0, 127), 0, 3, [(0, 0, 5, KG(0, 63)), (1, 0, 5, KG(64, 127))])
    assert new_pieces(now, []) == [Piece(KG(0, 127), 0, 3, True, {})]


def test_partly_covered_key_groups_are_cut_and_registrations_come_once() -> None:
    # The handle's key groups 0..63; the log's earlier handle covered 32..63 up to 9.
    before = handle("L", KG(32, 63), 0, 9, [(0, 0, 40, KG(32, 63))])
    now = handle("L", KG(0, 63), 0, 15, [(0, 0, 70, KG(0, 63))])
    assert new_pieces(now, [before]) == [
        Piece(KG(0, 31), 0, 15, False, {}),
        Piece(KG(32, 63), 10, 15, False, {0: 40}),
        Piece(KG.empty(), 10, 15, True, {0: 40}),
    ]


def test_feed_options_are_checked_with_exact_messages() -> None:
    base = {"kafka.bootstrap.servers": "b:9092", "application": "app"}
    with pytest.raises(ReaderOptionError) as missing:
        parse_feed_options(base, streaming=True)
    assert str(missing.value) == (
        "format('kafka-changelog') needs the option startingCheckpoint for a change feed "
        "(readStream): where the feed starts, exclusive: a checkpoint id (its changes are "
        "not emitted, those of the checkpoints after it are), 'latest' or 'earliest' "
        "(before the earliest retained checkpoint)")
    with pytest.raises(ReaderOptionError) as ending:
        parse_feed_options({**base, "startingCheckpoint": "1", "endingCheckpoint": "3"},
                           streaming=True)
    assert str(ending.value) == ("option endingCheckpoint is for batch reads (spark.read); "
                                 "a change feed runs until it is stopped")
    with pytest.raises(ReaderOptionError) as mode:
        parse_feed_options({**base, "startingCheckpoint": "1", "mode": "state"},
                           streaming=False)
    assert str(mode.value) == ("changes between checkpoints is read in mode 'changes' only; "
                               "got option mode 'state'")
    with pytest.raises(ReaderOptionError) as both:
        parse_feed_options({**base, "startingCheckpoint": "1", "checkpoint": "2"},
                           streaming=False)
    assert str(both.value) == ("option checkpoint does not go with changes between "
                               "checkpoints: use startingCheckpoint and endingCheckpoint")
    with pytest.raises(ReaderOptionError) as order:
        parse_feed_options({**base, "startingCheckpoint": "4", "endingCheckpoint": "3"},
                           streaming=False)
    assert str(order.value) == "option endingCheckpoint (3) must be >= startingCheckpoint (4)"
    with pytest.raises(ReaderOptionError) as value:
        parse_feed_options({**base, "startingCheckpoint": "first"}, streaming=True)
    assert str(value.value) == ("option startingCheckpoint must be a checkpoint id (an "
                                "integer) or one of latest, earliest; got 'first'")
    parsed = parse_feed_options({**base, "STARTINGCHECKPOINT": "Earliest",
                                 "failOnDataLoss": "false"}, streaming=True)
    assert (parsed.starting, parsed.ending, parsed.fail_on_data_loss) == ("earliest", None, False)


def test_filters_select_the_key_groups_of_their_keys() -> None:
    a, b = b"user-1", b"user-2"
    ga, gb = key_group_for_key(a, 128), key_group_for_key(b, 128)
    assert select([EqualTo(("key",), bytearray(a))]).groups(128, None) == {ga}
    assert select([In(("key",), (a, b))]).groups(128, None) == {ga, gb}
    assert select([In(("key",), (a, b)), EqualTo(("key",), a)]).groups(128, None) == {ga}
    ranged = select([GreaterThanOrEqual(("key_group",), 10), LessThan(("key_group",), 13)])
    assert ranged.groups(128, None) == {10, 11, 12}
    assert select([EqualTo(("value",), b"x")]).is_empty
    assert select([EqualTo(("key",), "not bytes")]).is_empty
    # key_decoded: through the recorded key types; a text no type encodes narrows nothing.
    assert select([EqualTo(("key_decoded",), "42")]).groups(128, ["bigint"]) == {
        key_group_for_key(encode_key([42], ["bigint"]), 128)}
    assert select([EqualTo(("key_decoded",), "user-1")]).groups(128, ["string"]) == {ga}
    assert select([EqualTo(("key_decoded",), "x")]).groups(128, ["bigint"]) == set(range(128))
    assert select([EqualTo(("key_decoded",), "x")]).groups(128, None) == set(range(128))
    assert key_bytes_of_text('["eu",7]', ["string", "int"]) == encode_key(["eu", 7],
                                                                         ["string", "int"])
    assert KeySelection().groups(128, None) is None
    assert selected_runs(KG(0, 15), frozenset({3, 4, 5, 9, 20})) == [KG(3, 5), KG(9, 9)]


def test_changes_only_in_a_snapshot_are_reported_with_their_sequence_numbers() -> None:
    from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
    from spark_integration.reader.checkpoint_changes import ChangesOnlyInSnapshotError, check_no_gap

    before = CompletedCheckpoint("app", 4, 0, 128, ())
    after = CompletedCheckpoint("app", 5, 0, 128, ())
    earlier = [handle("L", KG(0, 63), 0, 9, [(0, 0, 40, KG(0, 63))])]
    check_no_gap(before, after, "op", 1, handle("L", KG(0, 63), 10, 12, []), earlier)
    check_no_gap(before, after, "op", 1, handle("L", KG(0, 63), 0, -1, []), earlier)
    with pytest.raises(ChangesOnlyInSnapshotError) as gap:
        check_no_gap(before, after, "op", 1, handle("L", KG(0, 63), 14, 20, []), earlier)
    assert str(gap.value) == (
        "application 'app': checkpoint 5 committed the change sets 10..13 of log L (operator "
        "'op', subtask 1) inside a materialization only: checkpoint 4 covers them up to 9, "
        "checkpoint 5's changelog starts at 14, and they were never written to the "
        "changelog. Read the state of both checkpoints (mode state) for their net effect, or "
        "set failOnDataLoss=false to skip them")


def test_feed_tasks_are_grouped_in_runs_that_keep_their_order() -> None:
    from spark_integration.reader.checkpoint_changes import FeedTask, contiguous_groups
    from spark_integration.reader.feed_schema import CheckpointStamp
    from spark_integration.reader.scan import OffsetSlice

    tasks = [FeedTask("op", 0, OffsetSlice("t", 0, i, i + 1, "L", 0, 0, 0, 0),
                      CheckpointStamp(1, None, 0), estimated_bytes=size)
             for i, size in enumerate([100, 100, 1, 1, 100, 1])]
    runs = contiguous_groups(tasks, 2)
    assert [t for run in runs for t in run] == tasks
    assert [len(run) for run in runs] == [2, 4]
    assert contiguous_groups(tasks, 10) == [(t,) for t in tasks]
    assert contiguous_groups([], 2) == []
