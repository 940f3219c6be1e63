"""Planning, slicing, payload decoding and Arrow rows of ``format("kafka-changelog")``.

Pure Python: no Spark, no broker.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import itertools
import pickle
import re
import struct
import subprocess
import sys
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_changelog import InMemoryChangelogHandle, KeyGroupRange, RecordDecodeError
from kafka_changelog.kafka.client_settings import CLIENT_DEFAULTS
from kafka_changelog.kafka.handle import KafkaChangelogHandle, PartitionRange
from kafka_changelog.keys import encode_key
from kafka_changelog.serialization import load_schema
from kafka_changelog.state.checkpoints.checkpoint import (
    CompletedCheckpoint,
    KeyedStateHandle,
    SubtaskState,
)
from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
from kafka_changelog.state.schema.descriptors import StateKind
from kafka_changelog.state.schema.ops import OpKind, StateMeta, StateOp
from kafka_changelog.state.snapshots.snapshot import ChunkRef, SnapshotHandle
from kafka_changelog.state.tables.memory import StateTable
from spark_integration.reader.planning import (
    DEFAULT_CHECKPOINT_TOPIC,
    DEFAULT_SLICE_KEY_GROUPS,
    DEFAULT_SLICE_OFFSETS,
    ChangesTask,
    CheckpointSelectionError,
    ReaderOptionError,
    StateTask,
    UnreadableCheckpointError,
    check_topics,
    parse_options,
    plan_changes,
    plan_state,
    select_checkpoint,
    select_operators,
    split_key_groups,
    split_offsets,
)
from spark_integration.reader.rows import (
    CHANGES_SCHEMA,
    META_OP,
    STATE_SCHEMA,
    change_batches,
    decoded_keys,
    render_value,
    state_batches,
)
from spark_integration.reader.scan import OP_SYMBOLS, OffsetSlice, ScannedChange, decode_state_op

SERVERS = "127.0.0.1:9092"
BASE = {"kafka.bootstrap.servers": SERVERS, "application": "shop"}


# -- options -----------------------------------------------------------------------------------


def test_options_have_the_documented_defaults() -> None:
    options = parse_options(BASE)
    assert options.bootstrap_servers == SERVERS
    assert options.application == "shop"
    assert options.operator is None and options.checkpoint_id is None
    assert options.mode == "changes"
    # The data topics: whichever the checkpoint's handles name.
    assert options.changelog_topic is None and options.snapshot_topic is None
    assert options.checkpoint_topic == DEFAULT_CHECKPOINT_TOPIC == "kafka-changelog-checkpoints"
    assert options.slice_offsets == DEFAULT_SLICE_OFFSETS == 200_000
    assert options.slice_key_groups == DEFAULT_SLICE_KEY_GROUPS == 16
    assert options.client_config == {}


def test_options_are_case_insensitive_and_pass_kafka_settings_through() -> None:
    options = parse_options({
        **BASE, "Mode": "STATE", "slice.keyGroups": "4", "Checkpoint": "12",
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.username": "alice",
        "operator": "sessions", "slice.offsets": "10",
    })
    assert options.mode == "state" and options.slice_key_groups == 4
    assert options.checkpoint_id == 12 and options.operator == "sessions"
    assert options.slice_offsets == 10
    assert options.client_config == {"security.protocol": "SASL_SSL", "sasl.username": "alice"}
    # The library's client defaults first, then the user's settings.
    assert options.client_settings() == {"bootstrap.servers": SERVERS, **CLIENT_DEFAULTS,
                                         "security.protocol": "SASL_SSL",
                                         "sasl.username": "alice"}
    # Every client kind gets the security settings.
    assert options.changelog_config().consumer()["sasl.username"] == "alice"
    assert options.snapshot_config().consumer()["sasl.username"] == "alice"
    assert options.checkpoint_config().consumer()["sasl.username"] == "alice"
    assert parse_options({**BASE, "checkpoint": "latest"}).checkpoint_id is None


@pytest.mark.parametrize(("options", "message"), [
    ({"application": "a"}, "needs the option kafka.bootstrap.servers"),
    ({"kafka.bootstrap.servers": SERVERS}, "needs the option application"),
    ({**BASE, "mode": "rows"},
     "option mode must be one of changes, state, timers; got 'rows'"),
    ({**BASE, "slice.offsets": "many"}, "option slice.offsets must be an integer, got 'many'"),
    ({**BASE, "slice.offsets": "0"}, "option slice.offsets must be >= 1, got 0"),
    ({**BASE, "slice.keyGroups": "-2"}, "option slice.keyGroups must be >= 1, got -2"),
    ({**BASE, "checkpoint": "last"}, "option checkpoint must be a checkpoint id"),
    ({**BASE, "checkpoint": "-1"}, "option checkpoint must be >= 0, got -1"),
    ({**BASE, "chekpoint": "3"}, "unknown option(s) chekpoint"),
])
def test_bad_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ReaderOptionError) as caught:
        parse_options(options)
    assert message in str(caught.value)


# -- slicing -----------------------------------------------------------------------------------


@given(st.integers(0, 10**12), st.integers(0, 5000), st.integers(1, 700))
def test_offset_slices_cover_the_range_exactly(start: int, count: int, size: int) -> None:
    pieces = split_offsets(start, start + count, size)
    assert all(0 < e - s <= size for s, e in pieces)
    assert [s for s, _ in pieces] == list(range(start, start + count, size))
    if pieces:
        assert pieces[0][0] == start and pieces[-1][1] == start + count
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    else:
        assert count == 0


@given(st.integers(0, 200), st.integers(0, 300), st.integers(1, 40))
def test_key_group_slices_cover_the_range_exactly(start: int, length: int, size: int) -> None:
    whole = KeyGroupRange(start, start + length - 1)
    pieces = split_key_groups(whole, size)
    assert [kg for piece in pieces for kg in piece] == list(whole)
    assert all(1 <= len(piece) <= size for piece in pieces)


def test_slice_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_offsets must be >= 1, got 0"):
        split_offsets(0, 10, 0)
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        split_key_groups(KeyGroupRange(0, 3), 0)


# -- planning a checkpoint ---------------------------------------------------------------------


def kafka_handle(log_id: str, key_groups: KeyGroupRange, ranges: list[tuple[int, int, int]],
                 topic: str = "log", meta_partition: int = 0) -> KafkaChangelogHandle:
    return KafkaChangelogHandle(
        log_id, topic, key_groups,
        [PartitionRange(p, s, e, KeyGroupRange(p * 32, p * 32 + 31).intersection(key_groups),
                        100) for p, s, e in ranges],
        from_sequence_number=3, to_sequence_number=9, meta_partition=meta_partition,
        checkpoint_id=7)


def snapshot(backend: str, key_groups: KeyGroupRange, topic: str = "snap") -> SnapshotHandle:
    chunks = tuple(ChunkRef(kg, 5, 0, 1, kg // 32, 1000 + kg, 10, 0) for kg in key_groups)
    return SnapshotHandle(backend, 5, key_groups, topic, chunks, 2)


def checkpoint_of(subtasks: list[SubtaskState], checkpoint_id: int = 7,
                  application: str = "shop") -> CompletedCheckpoint:
    return CompletedCheckpoint(application, checkpoint_id, 1, 128, tuple(subtasks))


def two_subtasks(topic: str = "log", snapshot_topic: str = "snap") -> CompletedCheckpoint:
    low, high = KeyGroupRange(0, 63), KeyGroupRange(64, 127)
    return checkpoint_of([
        SubtaskState("op", 0, 2, KeyedStateHandle(
            "b0", low, 5, snapshot("b0", low, snapshot_topic),
            (kafka_handle("w0", low, [(0, 10, 15), (1, 0, 1000)], topic),)), None),
        SubtaskState("op", 1, 2, KeyedStateHandle(
            "b1", high, 5, None,
            (kafka_handle("w1", high, [(2, 5, 6)], topic, 2),
             kafka_handle("w2", high, [(2, 8, 8), (3, 0, 250)], topic, 2))), None),
        SubtaskState("other", 0, 1, None, None),
    ])


def test_changes_tasks_cover_every_range_with_the_handle_filters() -> None:
    checkpoint = two_subtasks()
    tasks = plan_changes(checkpoint, ["op", "other"], 100)
    assert all(isinstance(t, ChangesTask) for t in tasks)
    covered: dict[tuple[int, str, int], list[tuple[int, int]]] = {}
    for task in tasks:
        s = task.slice
        assert 0 < s.offset_count <= 100 and s.topic == "log"
        assert (s.from_sequence_number, s.to_sequence_number) == (3, 9)
        covered.setdefault((task.subtask, s.log_id, s.partition), []).append(
            (s.start_offset, s.end_offset))
        low, high = (0, 63) if task.subtask == 0 else (64, 127)
        assert (s.key_group_start, s.key_group_end) == (low, high)
    assert covered == {
        (0, "w0", 0): [(10, 15)],
        (0, "w0", 1): [(0, 100), (100, 200), (200, 300), (300, 400), (400, 500), (500, 600),
                       (600, 700), (700, 800), (800, 900), (900, 1000)],
        (1, "w1", 2): [(5, 6)],
        (1, "w2", 3): [(0, 100), (100, 200), (200, 250)],  # the empty range [8, 8) is skipped
    }
    assert len(plan_changes(checkpoint, ["op"], 10**9)) == 4


def test_tasks_carry_the_key_types_the_checkpoint_records() -> None:
    plain = two_subtasks()
    assert {t.key_types for t in plan_changes(plain, ["op"], 100)} == {None}
    typed = dataclasses.replace(plain, properties={"spark.key_types": '["string", "bigint"]'})
    assert {t.key_types for t in plan_changes(typed, ["op"], 100)} == {("string", "bigint")}
    assert {t.key_types for t in plan_state(typed, ["op"], 20)} == {("string", "bigint")}
    broken = dataclasses.replace(plain, properties={"spark.key_types": '{"a": 1}'})
    with pytest.raises(UnreadableCheckpointError, match=re.escape(
            "checkpoint 7 of application 'shop': checkpoint property spark.key_types is not "
            "a list of type names")):
        plan_state(broken, ["op"], 20)


def test_state_tasks_are_key_group_slices_of_each_subtask() -> None:
    checkpoint = two_subtasks()
    tasks = plan_state(checkpoint, ["op"], 20)
    assert all(isinstance(t, StateTask) for t in tasks)
    assert [(t.subtask, t.key_groups.start, t.key_groups.end) for t in tasks] == [
        (0, 0, 19), (0, 20, 39), (0, 40, 59), (0, 60, 63),
        (1, 64, 83), (1, 84, 103), (1, 104, 123), (1, 124, 127),
    ]
    for task in tasks:
        assert task.handle.key_group_range == task.key_groups
        if task.handle.snapshot is not None:
            assert {c.key_group for c in task.handle.snapshot.chunks} == set(task.key_groups)
        for handle in task.handle.changelog:
            assert handle.key_group_range == task.key_groups
    # The slice of subtask 0 with key groups 40-59 reads partition 1 and the meta partition 0.
    middle = tasks[2].handle.changelog[0]
    assert isinstance(middle, KafkaChangelogHandle)
    assert [r.partition for r in middle.ranges] == [0, 1]


def test_timers_tasks_are_the_state_tasks_marked_for_timers() -> None:
    checkpoint = two_subtasks()
    assert parse_options({**BASE, "mode": "TIMERS"}).mode == "timers"
    state = plan_state(checkpoint, ["op"], 20)
    timers = plan_state(checkpoint, ["op"], 20, timers=True)
    assert [t.timers for t in state] == [False] * 8 and [t.timers for t in timers] == [True] * 8
    assert [dataclasses.replace(t, timers=False) for t in timers] == state


def test_tasks_survive_pickling() -> None:
    checkpoint = two_subtasks()
    tasks: list[Any] = [*plan_changes(checkpoint, ["op"], 100), *plan_state(checkpoint, ["op"], 7)]
    assert pickle.loads(pickle.dumps(tasks)) == tasks


def test_a_handle_of_another_storage_is_refused_by_name() -> None:
    whole = KeyGroupRange(0, 127)
    checkpoint = checkpoint_of([SubtaskState("op", 0, 1, KeyedStateHandle(
        "b", whole, 0, None, (InMemoryChangelogHandle("mem-1", whole, []),)), None)])
    for plan in (lambda: plan_changes(checkpoint, ["op"], 10),
                 lambda: plan_state(checkpoint, ["op"], 10)):
        with pytest.raises(UnreadableCheckpointError) as caught:
            plan()
        assert "handle of kind 'memory' (operator 'op', subtask 0, log mem-1)" in str(caught.value)


def test_topics_must_be_the_ones_the_options_name_and_exist() -> None:
    checkpoint = two_subtasks(topic="log-a", snapshot_topic="snap-a")
    ops = ["op"]
    ok = {**BASE, "changelog.topic": "log-a", "snapshot.topic": "snap-a"}
    check_topics(checkpoint, ops, parse_options(ok), {"log-a", "snap-a"})
    # Changes mode does not need the snapshot topic.
    check_topics(checkpoint, ops, parse_options({**ok, "snapshot.topic": "x"}), {"log-a"})
    # Without the options, the topics the handles name are read.
    check_topics(checkpoint, ops, parse_options(BASE), {"log-a"})
    check_topics(checkpoint, ops, parse_options({**BASE, "mode": "state"}), {"log-a", "snap-a"})
    # Timers are keyed state: mode timers reads the snapshots too.
    with pytest.raises(UnreadableCheckpointError, match="snapshot topic 'snap-a' of checkpoint"):
        check_topics(checkpoint, ops, parse_options({**BASE, "mode": "timers"}), {"log-a"})
    with pytest.raises(UnreadableCheckpointError) as caught:
        check_topics(checkpoint, ops, parse_options({**BASE, "changelog.topic": "log-b"}),
                     {"log-a"})
    assert ("checkpoint 7 of application 'shop' keeps its changelog in topic(s) log-a, not in "
            "'log-b' (option changelog.topic)") in str(caught.value)
    with pytest.raises(UnreadableCheckpointError, match=r"option snapshot\.topic"):
        check_topics(checkpoint, ops, parse_options({**ok, "mode": "state",
                                                     "snapshot.topic": "x"}), {"log-a"})
    with pytest.raises(UnreadableCheckpointError) as caught:
        check_topics(checkpoint, ops, parse_options({**ok, "mode": "state"}), {"log-a"})
    assert "snapshot topic 'snap-a' of checkpoint 7 of application 'shop' does not exist" in str(
        caught.value)


def test_checkpoint_selection_errors_name_what_exists() -> None:
    store = InMemoryCheckpointStore(retain=3)
    for checkpoint_id in (1, 2, 3):
        store.commit(checkpoint_of([], checkpoint_id))
    store.commit(checkpoint_of([], 1, application="billing"))
    assert select_checkpoint(store, "shop", None, "cps").checkpoint_id == 3
    assert select_checkpoint(store, "shop", 2, "cps").checkpoint_id == 2
    with pytest.raises(CheckpointSelectionError) as caught:
        select_checkpoint(store, "shop", 9, "cps")
    assert str(caught.value) == (
        "application 'shop' has no checkpoint 9 in checkpoint topic cps (option checkpoint); "
        "retained checkpoint ids: 1, 2, 3")
    with pytest.raises(CheckpointSelectionError) as caught:
        select_checkpoint(store, "shpo", None, "cps")
    assert str(caught.value) == (
        "application 'shpo' has no checkpoint in checkpoint topic cps (options application, "
        "checkpoint.topic); applications with checkpoints there: billing, shop")


def test_operator_selection() -> None:
    checkpoint = two_subtasks()
    assert select_operators(checkpoint, None) == ["op", "other"]
    assert select_operators(checkpoint, "op") == ["op"]
    with pytest.raises(CheckpointSelectionError) as caught:
        select_operators(checkpoint, "sessions")
    assert str(caught.value) == (
        "checkpoint 7 of application 'shop' has no operator 'sessions' (option operator); its "
        "operators: op, other")


# -- state-op payloads ----------------------------------------------------------------------------


def test_op_symbols_are_the_op_kinds() -> None:
    assert tuple(kind.value for kind in OpKind) == OP_SYMBOLS


blobs = st.binary(max_size=300)
state_ops = st.builds(
    StateOp,
    state=st.text(min_size=1, max_size=80),
    op=st.sampled_from(list(OpKind)),
    key=blobs,
    map_key=st.none() | blobs,
    value=st.none() | blobs,
    values=st.none() | st.lists(blobs, max_size=70).map(tuple),
)


@settings(max_examples=300)
@given(state_ops)
def test_the_scan_decoder_gives_the_fields_of_the_op(op: StateOp) -> None:
    decoded = decode_state_op(op.to_bytes())
    assert decoded.state == op.state and decoded.op == op.op.value and decoded.key == op.key
    assert decoded.map_key == op.map_key and decoded.value == op.value
    assert decoded.values == (list(op.values) if op.values is not None else None)


@settings(max_examples=300)
@given(st.binary(max_size=60))
def test_garbage_is_a_value_error_or_what_avro_reads(data: bytes) -> None:
    try:
        decoded = decode_state_op(data)
    except ValueError:
        return
    buffer = io.BytesIO(data)
    expected = fastavro.schemaless_reader(buffer, load_schema("state_op"), None)
    assert buffer.tell() == len(data)
    assert decoded._asdict() == expected


def test_array_blocks_with_byte_sizes_are_read() -> None:
    # state "s", op LIST_ADD, key b"k", no map key, no value, values in a block of -2 items
    # (a negative count is followed by the block's size in bytes), then the end block.
    payload = b"\x02s" + b"\x04" + b"\x02k" + b"\x00" + b"\x00" + b"\x02" + b"\x03" + b"\x08" + (
        b"\x02a\x02b") + b"\x00"
    assert decode_state_op(payload).values == [b"a", b"b"]
    with pytest.raises(ValueError, match="trailing bytes"):
        decode_state_op(payload + b"\x00")
    with pytest.raises(ValueError, match="truncated"):
        decode_state_op(payload[:-3])


# -- rows ----------------------------------------------------------------------------------------


def test_values_render_by_serializer() -> None:
    assert render_value("utf8", "héllo".encode()) == "héllo"
    assert render_value("int64", struct.pack(">q", -42)) == "-42"
    assert render_value("float64", struct.pack(">d", 1.5)) == "1.5"
    assert render_value("json", b'{"a":[1,2]}') == '{"a":[1,2]}'
    assert render_value("bytes", b"\x00") is None
    assert render_value("avro:0123456789abcdef", b"\x02") is None
    assert render_value("int64", b"\x01") is None  # not 8 bytes: not an int64
    assert render_value("utf8", b"\xff") is None


SLICE = OffsetSlice("log", 2, 100, 200, "w-1", 64, 95, 3, 9)


def test_avro_values_render_as_json_in_the_latest_schema_the_registration_records() -> None:
    """``value_decoded`` of an Avro state: JSON (sorted keys) of the value resolved to the
    latest schema its registration records; so a checkpoint read shows the schema the
    application had registered by then. 0.2.0's states (no schema recorded): null."""
    from kafka_changelog.state.schema.avro_names import avro_name, schema_json
    from kafka_changelog.state.schema.serializers import AvroSerializer

    v1 = {"type": "record", "name": "Profile",
          "fields": [{"name": "visits", "type": "long"}, {"name": "tag", "type": "bytes"}]}
    v2 = {**v1, "fields": [*v1["fields"],
                           {"name": "channel", "type": "string", "default": "web"}]}
    written = AvroSerializer(v1).serialize({"visits": 3, "tag": b"\x01"})
    assert render_value(avro_name([schema_json(v1)]), written) == (
        '{"tag": {"base64": "AQ=="}, "visits": 3}')
    assert render_value(avro_name([schema_json(v1), schema_json(v2)]), written) == (
        '{"channel": "web", "tag": {"base64": "AQ=="}, "visits": 3}')
    legacy = AvroSerializer(v1, legacy=True)
    assert render_value(legacy.name, legacy.serialize({"visits": 3, "tag": b""})) is None
    assert render_value(avro_name([schema_json(v1)]), b"not avro") is None


def test_change_rows_decode_ops_and_registrations() -> None:
    meta = StateMeta("pages", StateKind.MAP, "int64", "utf8").to_bytes()
    ops = [
        StateOp("pages", OpKind.MAP_PUT, b"u1", b"home", b"\x01"),
        StateOp("events", OpKind.LIST_REPLACE, b"u2", values=(b"a", b"b")),
        StateOp("count", OpKind.DELETE, b"u3"),
    ]
    changes = [ScannedChange(100, 3, 0, -1, meta)] + [
        ScannedChange(101 + i, 4, i, 70, op.to_bytes()) for i, op in enumerate(ops)]
    batches = list(change_batches(changes, "op", 1, SLICE, batch_rows=3))
    assert [b.num_rows for b in batches] == [3, 1]
    assert all(b.schema.equals(CHANGES_SCHEMA) for b in batches)
    rows = [r for b in batches for r in b.to_pylist()]
    assert rows[0] == {
        "operator": "op", "subtask": 1, "log_id": "w-1", "key_group": None, "topic": "log",
        "partition": 2, "offset": 100, "sequence_number": 3, "position": 0, "op": META_OP,
        "state": "pages", "key": None, "map_key": None, "value": meta, "values": None,
        "key_decoded": None}
    assert [(r["op"], r["state"], r["key"], r["map_key"], r["value"], r["values"])
            for r in rows[1:]] == [
        ("MAP_PUT", "pages", b"u1", b"home", b"\x01", None),
        ("LIST_REPLACE", "events", b"u2", None, None, [b"a", b"b"]),
        ("DELETE", "count", b"u3", None, None, None),
    ]
    assert [r["offset"] for r in rows] == [100, 101, 102, 103]
    assert {r["key_group"] for r in rows[1:]} == {70}
    assert [r["key_decoded"] for r in rows] == [None] * 4  # no key types recorded
    typed = [r for b in change_batches(changes, "op", 1, SLICE, key_types=("string",))
             for r in b.to_pylist()]
    assert [r["key_decoded"] for r in typed] == [None, "u1", "u2", "u3"]


def test_key_decoded_follows_the_recorded_key_types() -> None:
    ids = [encode_key((n,), ("bigint",)) for n in (7, 7, -2)]
    assert decoded_keys([None, *ids, b"odd"], ("bigint",)) == [None, "7", "7", "-2", None]
    assert decoded_keys(ids, None) == [None, None, None]
    pair = encode_key(("eu", 10**12), ("string", "bigint"))
    assert decoded_keys([pair], ("string", "bigint")) == ['["eu",1000000000000]']


def test_an_undecodable_payload_names_its_offset() -> None:
    bad = [ScannedChange(150, 4, 2, 70, b"\xff\xff")]
    with pytest.raises(RecordDecodeError) as caught:
        list(change_batches(bad, "op", 0, SLICE))
    assert caught.value.offset == 150 and caught.value.partition == 2
    assert "change 2 of change set 4 (log w-1) is not a state op" in str(caught.value)
    with pytest.raises(RecordDecodeError, match="is not a registration"):
        list(change_batches([ScannedChange(151, 4, 0, -1, b"\xff")], "op", 0, SLICE))


def test_state_rows_expand_lists_and_maps_in_order() -> None:
    table = StateTable()
    table.register(StateMeta("count", StateKind.VALUE, "int64"))
    table.register(StateMeta("events", StateKind.LIST, "utf8"))
    table.register(StateMeta("pages", StateKind.MAP, "json", "utf8"))
    table.register(StateMeta("raw", StateKind.REDUCING, "bytes"))
    table.apply(9, StateOp("count", OpKind.SET, b"u", value=struct.pack(">q", 7)))
    table.apply(9, StateOp("events", OpKind.LIST_ADD, b"u", values=(b"x", b"y")))
    table.apply(9, StateOp("pages", OpKind.MAP_PUT, b"u", b"b", b"[1]"))
    table.apply(9, StateOp("pages", OpKind.MAP_PUT, b"u", b"a", b"{}"))
    table.apply(3, StateOp("raw", OpKind.SET, b"v", value=b"\x00"))
    batches = list(state_batches(table, "op", batch_rows=4))
    assert [b.num_rows for b in batches] == [4, 2]
    assert all(b.schema.equals(STATE_SCHEMA) for b in batches)
    rows = [tuple(r.values()) for b in batches for r in b.to_pylist()]
    assert rows == [
        ("op", 3, "raw", "REDUCING", b"v", None, None, b"\x00", None, None, None),
        ("op", 9, "count", "VALUE", b"u", None, None, struct.pack(">q", 7), "7", None, None),
        ("op", 9, "events", "LIST", b"u", None, 0, b"x", "x", None, None),
        ("op", 9, "events", "LIST", b"u", None, 1, b"y", "y", None, None),
        ("op", 9, "pages", "MAP", b"u", b"a", None, b"{}", "{}", None, None),
        ("op", 9, "pages", "MAP", b"u", b"b", None, b"[1]", "[1]", None, None),
    ]
    typed = [r["key_decoded"] for b in state_batches(table, "op", key_types=("string",))
             for r in b.to_pylist()]
    assert typed == ["v", "u", "u", "u", "u", "u"]
    assert list(state_batches(StateTable(), "op")) == []


def test_state_rows_of_ttl_states_hide_what_expired_at_the_checkpoint_and_show_expiry() -> None:
    from kafka_changelog.state.schema.ttl import stamp

    table = StateTable()
    table.register(StateMeta("seen", StateKind.VALUE, "ttl:int64"))
    table.register(StateMeta("pages", StateKind.LIST, "ttl:utf8"))
    table.register(StateMeta("kinds", StateKind.MAP, "ttl:int64", "utf8"))
    one = struct.pack(">q", 1)
    table.apply(1, StateOp("seen", OpKind.SET, b"old", value=stamp(1_000, one)))
    table.apply(1, StateOp("seen", OpKind.SET, b"new", value=stamp(5_000, one)))
    table.apply(1, StateOp("pages", OpKind.LIST_ADD, b"new",
                           values=(stamp(1_000, b"/a"), stamp(9_000, b"/b"))))
    table.apply(1, StateOp("kinds", OpKind.MAP_PUT, b"new", b"buy", stamp(2_000, one)))
    table.apply(1, StateOp("kinds", OpKind.MAP_PUT, b"new", b"view", stamp(3_000, one)))
    rows = [(r["state"], r["key"], r["map_key"], r["list_index"], r["value"],
             r["value_decoded"], r["expires_at"])
            for b in state_batches(table, "op", at_ms=2_000) for r in b.to_pylist()]
    at = dt.datetime.fromtimestamp
    utc = dt.timezone.utc
    assert rows == [
        ("kinds", b"new", b"view", None, one, "1", at(3, utc)),
        ("pages", b"new", None, 0, b"/b", "/b", at(9, utc)),
        ("seen", b"new", None, None, one, "1", at(5, utc)),
    ]
    everything = [r["expires_at"] for b in state_batches(table, "op") for r in b.to_pylist()]
    assert len(everything) == 6  # without a time: every entry, expired or not


def test_timer_rows_decode_the_reserved_state_and_state_rows_leave_it_out() -> None:
    from kafka_changelog.state.time.timers import TIMERS_STATE, TimeDomain, timer_map_key
    from spark_integration.reader.timer_rows import TIMERS_SCHEMA, timer_batches

    table = StateTable()
    table.register(StateMeta("count", StateKind.VALUE, "int64"))
    table.register(StateMeta(TIMERS_STATE, StateKind.MAP, "bytes", "bytes"))
    table.apply(9, StateOp("count", OpKind.SET, b"u", value=struct.pack(">q", 7)))
    for key_group, key, domain, ms, tag in [
            (9, b"u", TimeDomain.EVENT_TIME, 5_000, b""),
            (9, b"u", TimeDomain.PROCESSING_TIME, 7_000, b""),
            (9, b"u", TimeDomain.EXPIRY, 6_000, b"count"),
            (3, b"v", TimeDomain.EVENT_TIME, -1_000, b""),
            (9, b"u", TimeDomain.PROCESSING_TIME, 2_000, b"")]:
        table.apply(key_group, StateOp(TIMERS_STATE, OpKind.MAP_PUT, key,
                                       timer_map_key(domain, ms, tag), b""))
    batches = list(timer_batches(table, "op", batch_rows=3, key_types=("string",)))
    assert [b.num_rows for b in batches] == [3, 2]
    assert all(b.schema.equals(TIMERS_SCHEMA) for b in batches)
    utc = dt.timezone.utc
    at = dt.datetime.fromtimestamp
    assert [tuple(r.values()) for b in batches for r in b.to_pylist()] == [
        ("op", 3, b"v", "v", "event_time", at(-1, utc), None),
        ("op", 9, b"u", "u", "processing_time", at(2, utc), None),
        ("op", 9, b"u", "u", "processing_time", at(7, utc), None),
        ("op", 9, b"u", "u", "event_time", at(5, utc), None),
        ("op", 9, b"u", "u", "expiry", at(6, utc), "count"),
    ]
    assert [r["state"] for b in state_batches(table, "op") for r in b.to_pylist()] == ["count"]
    assert list(timer_batches(StateTable(), "op")) == []


def test_the_reader_modules_do_not_import_pyspark() -> None:
    code = ("import sys, spark_integration.reader.planning, spark_integration.reader.rows, "
            "spark_integration.reader.scan, spark_integration.reader.timer_rows; "
            "assert 'pyspark' not in sys.modules, 'pyspark imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
