"""State schema evolution: Avro values read across schema changes, refusals, drops."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest

from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange
from kafka_changelog.cli.values import Raw, decode_entry
from kafka_changelog.keygroups import key_group_for_key
from kafka_changelog.state.backend.config import StateBackendConfig
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle
from kafka_changelog.state.errors import StateMismatchError, StateSchemaError
from kafka_changelog.state.schema.avro_names import legacy_avro_name, schema_json
from kafka_changelog.state.schema.avro_resolution import resolution_problems
from kafka_changelog.state.schema.descriptors import StateKind, list_state, map_state, value_state
from kafka_changelog.state.schema.ops import SET, StateMeta
from kafka_changelog.state.schema.serializers import INT64, UTF8, AvroSerializer
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

from .state_helpers import MAX_P, ranges, users_in

V1 = {"type": "record", "name": "Click", "namespace": "shop", "fields": [
    {"name": "page", "type": "string"},
    {"name": "count", "type": "int"},
    {"name": "price", "type": "float"},
]}
# Reordered, widened (int -> long, float -> double), a field added with a default.
V2 = {"type": "record", "name": "Click", "namespace": "shop", "fields": [
    {"name": "count", "type": "long"},
    {"name": "page", "type": "string"},
    {"name": "price", "type": "double"},
    {"name": "referrer", "type": ["null", "string"], "default": None},
]}
# A field removed.
V3 = {"type": "record", "name": "Click", "namespace": "shop", "fields": [
    {"name": "count", "type": "long"},
    {"name": "referrer", "type": ["null", "string"], "default": None},
]}
USERS = [f"user-{i}".encode() for i in range(40)]


def clicks(schema: dict[str, Any]) -> Any:
    return value_state("clicks", AvroSerializer(schema))


@pytest.fixture
def storage() -> Iterator[InMemoryChangelogStorage]:
    with InMemoryChangelogStorage() as storage:
        yield storage


@pytest.fixture
def store() -> InMemorySnapshotStore:
    return InMemorySnapshotStore()


@pytest.fixture(params=["memory", "rocksdb"])
def table_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def restored(storage: Any, store: Any, kind: str, directory: Path, key_groups: KeyGroupRange,
             handles: list[KeyedStateHandle]) -> ChangelogKeyedStateBackend:
    table = StateBackendConfig(kind, str(directory)).create_table("op")
    return restore_backend(storage, store, "op", key_groups, MAX_P, handles, table=table)


# -- the rules ---------------------------------------------------------------------------


def test_avro_resolution_rules_allow_what_avro_resolves() -> None:
    assert resolution_problems(V1, V2) == []
    assert resolution_problems(V2, V3) == []
    assert resolution_problems(V1, V3) == []
    # Aliases rename a field and a record.
    renamed = {"type": "record", "name": "Visit", "aliases": ["shop.Click"], "fields": [
        {"name": "pages", "aliases": ["page"], "type": "string"},
        {"name": "count", "type": "long"}, {"name": "price", "type": "double"}]}
    assert resolution_problems(V1, renamed) == []
    # A union reader takes a non-union writer, and a writer union of branches it takes.
    assert resolution_problems("int", ["null", "long"]) == []
    assert resolution_problems(["null", "int"], ["null", "double"]) == []
    enum_v1 = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}
    enum_v2 = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}
    assert resolution_problems(enum_v1, enum_v2) == []


def test_avro_resolution_rules_name_each_problem() -> None:
    new_field = {"type": "record", "name": "Click", "namespace": "shop", "fields": [
        *V1["fields"], {"name": "referrer", "type": "string"}]}
    assert resolution_problems(V1, new_field) == [
        "field 'referrer' is new and has no default"]
    narrowed = {"type": "record", "name": "Click", "namespace": "shop", "fields": [
        {"name": "page", "type": "string"}, {"name": "count", "type": "int"},
        {"name": "price", "type": "int"}]}
    assert resolution_problems(V2, narrowed) == [
        "count: long cannot be read as int", "price: double cannot be read as int"]
    enum_v2 = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}
    enum_v1 = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}
    assert resolution_problems(enum_v2, enum_v1) == [
        "the value: enum symbols ['BLUE'] are not in the reader's enum, which has no default"]
    other = {"type": "record", "name": "Order", "fields": V1["fields"]}
    assert resolution_problems(V1, other) == [
        "the value: record shop.Click cannot be read as Order (another name, not an alias)"]
    assert resolution_problems(["null", "string"], "string") == [
        "the value: null cannot be read as string"]


# -- through checkpoints and restores ------------------------------------------------------


def test_values_written_with_older_schemas_read_resolved_after_restores_and_a_rescale(
        storage: Any, store: Any, table_kind: str, tmp_path: Path) -> None:
    # Two subtasks write V1; only subtask 0 sees V2 in the next run (subtask 1 has no
    # input then); a rescale to 3 merges key groups of both; V3 reads them all.
    first = [ChangelogKeyedStateBackend(storage, store, "op", r, MAX_P) for r in ranges(2)]
    for backend, key_groups in zip(first, ranges(2), strict=True):
        for user in users_in(USERS, key_groups):
            backend.set_current_key(user)
            backend.state(clicks(V1)).update({"page": "home", "count": 1, "price": 2.5})
    handles = [b.snapshot(1).result(10) for b in first]
    for b in first:
        b.close()

    second = [restored(storage, store, table_kind, tmp_path / f"a{i}", r, handles)
              for i, r in enumerate(ranges(2))]
    zero_users = users_in(USERS, ranges(2)[0])
    for user in zero_users[:5]:
        second[0].set_current_key(user)
        state = second[0].state(clicks(V2))
        assert state.value() == {"count": 1, "page": "home", "price": 2.5, "referrer": None}
        state.update({"count": 7, "page": "cart", "price": 0.25, "referrer": "ad"})
    second[0].materialize_now()  # a snapshot holding V1 and V2 values, both recorded
    handles = [b.snapshot(2).result(10) for b in second]
    for b in second:
        b.close()

    third = [restored(storage, store, table_kind, tmp_path / f"b{i}", r, handles)
             for i, r in enumerate(ranges(3))]
    found = {}
    for backend, key_groups in zip(third, ranges(3), strict=True):
        for user in users_in(USERS, key_groups):
            backend.set_current_key(user)
            found[user] = backend.state(clicks(V3)).value()
        backend.close()
    expected = {user: {"count": 1, "referrer": None} for user in USERS}
    expected.update({user: {"count": 7, "referrer": "ad"} for user in zero_users[:5]})
    assert found == expected


def test_the_cli_decoder_reads_every_value_resolved_to_the_latest_schema(
        storage: Any, store: Any) -> None:
    backend = ChangelogKeyedStateBackend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P)
    backend.set_current_key(b"a")
    backend.state(clicks(V1)).update({"page": "home", "count": 1, "price": 2.5})
    handle = backend.snapshot(1).result(10)
    backend.close()
    again = restore_backend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle])
    again.set_current_key(b"b")
    again.state(clicks(V2)).update({"count": 2, "page": "cart", "price": 1.0,
                                    "referrer": None})
    again.set_current_key(b"c")  # the key's net change is applied
    table = again._table
    meta = table.metas["clicks"]
    assert [schema["fields"][0]["name"] for schema in
            json.loads(meta.value_serializer[len("avro:"):])] == ["page", "count"]
    decoded = {key: decode_entry(meta, entry) for kg in table.key_groups()
               for _, key, entry in table.entries(kg)}
    assert decoded == {
        b"a": {"count": 1, "page": "home", "price": 2.5, "referrer": None},
        b"b": {"count": 2, "page": "cart", "price": 1.0, "referrer": None}}
    assert decode_entry(meta, b"\x00\x01") == Raw(b"\x00\x01")
    again.close()


def test_incompatible_declarations_are_refused_naming_the_state_and_why(
        storage: Any, store: Any) -> None:
    backend = ChangelogKeyedStateBackend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P)
    backend.set_current_key(b"a")
    backend.state(clicks(V1)).update({"page": "home", "count": 1, "price": 2.5})
    backend.state(value_state("visits", INT64)).update(3)
    backend.state(map_state("pages", UTF8, INT64)).put("home", 1)
    handle = backend.snapshot(1).result(10)
    backend.close()
    again = restore_backend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle])
    again.set_current_key(b"a")
    no_default = {"type": "record", "name": "Click", "namespace": "shop", "fields": [
        *V1["fields"], {"name": "referrer", "type": "string"}]}
    with pytest.raises(StateSchemaError) as caught:
        again.state(clicks(no_default))
    assert str(caught.value) == (
        "state 'clicks': the declared Avro schema cannot read values its earlier schemas "
        "wrote (from schema 1 of 1: field 'referrer' is new and has no default)")
    with pytest.raises(StateSchemaError) as caught:
        again.state(list_state("visits", INT64))
    assert str(caught.value) == (
        "state 'visits' is registered as VALUE with value serializer 'int64' but LIST with "
        "value serializer 'int64' was requested: a state's kind cannot change (give the "
        "new state another name, and drop this one)")
    with pytest.raises(StateSchemaError) as caught:
        again.state(value_state("visits", AvroSerializer("long")))
    assert str(caught.value).startswith(
        "state 'visits' is registered as VALUE with value serializer 'int64' but VALUE with "
        "value serializer 'avro:long (1 schema)' was requested: a serializer of another "
        "type cannot read its values")
    with pytest.raises(StateSchemaError, match="map keys are compared as bytes"):
        again.state(map_state("pages", AvroSerializer("string"), INT64))
    # A refused declaration changed nothing: the old ones still read.
    assert again.state(clicks(V1)).value() == {"page": "home", "count": 1, "price": 2.5}
    assert again.state(value_state("visits", INT64)).value() == 3
    assert isinstance(caught.value, StateMismatchError)
    again.close()


def test_a_state_of_0_2_0_reads_with_its_schema_and_cannot_evolve(
        storage: Any, store: Any) -> None:
    # 0.2.0 named Avro serializers by a fingerprint and wrote values without a header.
    legacy = legacy_avro_name(schema_json(V1))
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(V1),
                               {"page": "home", "count": 4, "price": 1.5})
    backend = ChangelogKeyedStateBackend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P)
    meta = StateMeta("clicks", StateKind.VALUE, legacy)
    backend._table.register(meta)
    backend._append_meta(meta)
    backend.set_current_key(b"a")
    backend.write("clicks", SET, None, buffer.getvalue(), None)
    handle = backend.snapshot(1).result(10)
    backend.close()
    again = restore_backend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle])
    again.set_current_key(b"a")
    state = again.state(clicks(V1))
    assert state.value() == {"page": "home", "count": 4, "price": 1.5}
    state.update({"page": "cart", "count": 5, "price": 1.5})
    again.set_current_key(b"b")  # the key's net change is applied
    assert again._table.get(key_group_for_key(b"a", MAX_P), "clicks", b"a") == \
        AvroSerializer(V1, legacy=True).serialize({"page": "cart", "count": 5, "price": 1.5})
    again.close()
    other = restore_backend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle])
    other.set_current_key(b"a")
    with pytest.raises(StateSchemaError, match=r"written by kafka-changelog 0\.2\.0"):
        other.state(clicks(V2))
    other.close()


def test_a_dropped_state_is_gone_after_restore_and_materialization(
        storage: Any, store: Any, table_kind: str, tmp_path: Path) -> None:
    backend = ChangelogKeyedStateBackend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P)
    for user in USERS:
        backend.set_current_key(user)
        backend.state(value_state("old", INT64)).update(1)
        backend.state(value_state("kept", INT64)).update(2)
    handle = backend.snapshot(1).result(10)
    backend.close()
    again = restored(storage, store, table_kind, tmp_path / "a", KeyGroupRange.of(0, 127),
                     [handle])
    assert again.drop_state("old") == len(USERS)
    assert again.drop_state("old") == 0
    assert again.drop_state("never") == 0
    again.set_current_key(USERS[0])
    with pytest.raises(StateMismatchError, match="'kept' is declared and in use"):
        again.state(value_state("kept", INT64))
        again.drop_state("kept")
    logged = again.snapshot(2).result(10)
    again.materialize_now()
    materialized = again.snapshot(3).result(10)
    again.close()
    for index, handles in enumerate(([logged], [materialized])):
        back = restored(storage, store, table_kind, tmp_path / f"b{index}",
                        KeyGroupRange.of(0, 127), handles)
        table = back._table
        assert {name for kg in table.key_groups() for name, _, _ in table.entries(kg)} == \
            {"kept"}
        back.close()
