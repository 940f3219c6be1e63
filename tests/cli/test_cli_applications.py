"""The read-only application commands against a real broker: ``applications``,
``checkpoints``, ``state`` and ``verify`` (with a deleted chunk and a truncated log)."""

from __future__ import annotations

import base64
import copy
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from kafka_changelog.cli.output import when
from kafka_changelog.kafka.handle import KafkaChangelogHandle
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint

from .cli_helpers import (
    MAX_P,
    Deployment,
    Model,
    Operator,
    Topics,
    cli,
    cli_json,
    clicks_work,
    end_offsets,
    expected_sizes,
    id_key,
    ids_work,
    kg,
    ranges,
    region_key,
    regions_work,
)

pytestmark = pytest.mark.broker

HOUR_MS = 3_600_000


@dataclass
class Shop:
    """Three applications on shared topics, with their models."""

    cluster: Any
    topics: Topics
    alpha: dict[str, Operator]
    alpha_round1: dict[str, Model]
    alpha_checkpoints: list[CompletedCheckpoint]
    beta: dict[str, Operator]
    beta_checkpoint: CompletedCheckpoint
    times: dict[str, int]

    def args(self, *args: str) -> list[str]:
        return [*self.topics.cli_args(self.cluster), *args]


@pytest.fixture(scope="module")
def shop(kafka_cluster: Any) -> Iterator[Shop]:
    topics = Topics.fresh()
    now = int(time.time() * 1000)
    times = {"alpha-1": now - 2 * HOUR_MS, "alpha-2": now - HOUR_MS, "beta-1": now - 300_000}
    alpha_ops = {"clicks": Operator(2, clicks_work("user", 10)),
                 "regions": Operator(2, regions_work(8)), "by-id": Operator(1, ids_work(6))}
    beta_ops = {"clicks": Operator(3, clicks_work("b", 6))}
    alpha = Deployment(kafka_cluster, "alpha", topics)
    beta = Deployment(kafka_cluster, "beta", topics)
    pending = Deployment(kafka_cluster, "pending", topics)
    try:
        first = alpha.run_round(1, alpha_ops, 1, times["alpha-1"], materialize=True)
        round1 = {name: copy.deepcopy(op.model) for name, op in alpha_ops.items()}
        second = alpha.run_round(2, alpha_ops, 2, times["alpha-2"], materialize=False)
        beta_cp = beta.run_round(1, beta_ops, 1, times["beta-1"], materialize=True,
                                 properties={"spark.query_id": "q-1", "spark.batch_id": "7"})
        # An application whose first checkpoint is under way: only a guard so far.
        pending.coordinator.restore_keyed("clicks", ranges(1)[0], None,
                                          pending.changelog).close()
        yield Shop(kafka_cluster, topics, alpha_ops, round1, [first, second], beta_ops,
                   beta_cp, times)
    finally:
        for deployment in (alpha, beta, pending):
            deployment.close()


def test_applications_lists_every_application_with_its_checkpoints(shop: Shop) -> None:
    found = cli_json(*shop.args("applications"))
    ages = [app.pop("age_s") for app in found]
    assert ages[0] >= 3600 and 300 <= ages[1] < 3600 and ages[2] is None
    guards = found[2].pop("guards")
    assert len(guards) == 1 and guards[0]["timestamp_ms"] > shop.times["alpha-1"]
    common = {"changelog_topics": [shop.topics.changelog],
              "snapshot_topics": [shop.topics.snapshot]}
    assert found == [
        {"application": "alpha", "latest_checkpoint": 2, "timestamp_ms": shop.times["alpha-2"],
         "time": when(shop.times["alpha-2"]), "max_parallelism": MAX_P,
         "operators": [{"operator": "by-id", "parallelism": 1},
                       {"operator": "clicks", "parallelism": 2},
                       {"operator": "regions", "parallelism": 2}],
         "checkpoint_ids": [1, 2], "properties": {}, **common, "guards": []},
        {"application": "beta", "latest_checkpoint": 1, "timestamp_ms": shop.times["beta-1"],
         "time": when(shop.times["beta-1"]), "max_parallelism": MAX_P,
         "operators": [{"operator": "clicks", "parallelism": 3}], "checkpoint_ids": [1],
         "properties": {"spark.batch_id": "7", "spark.query_id": "q-1"}, **common,
         "guards": []},
        {"application": "pending", "latest_checkpoint": None, "timestamp_ms": None,
         "time": None, "max_parallelism": None, "operators": [], "checkpoint_ids": [],
         "properties": {}, "changelog_topics": [], "snapshot_topics": []},
    ]
    shown = cli(*shop.args("applications"))
    assert shown.returncode == 0, shown.stderr
    rows = [re.split(r"\s{2,}", line) for line in shown.stdout.splitlines()]
    assert rows == [
        ["APPLICATION", "LATEST", "TIME", "AGE", "OPERATORS", "MAX_P", "CHECKPOINTS"],
        ["alpha", "2", when(shop.times["alpha-2"]), rows[1][3],
         "by-id (p=1), clicks (p=2), regions (p=2)", "128", "1,2"],
        ["beta", "1", when(shop.times["beta-1"]), rows[2][3], "clicks (p=3)", "128", "1"],
        ["pending", "none yet (1 guard(s))", "-", "-", "-", "-", "-"],
    ]
    assert re.fullmatch(r"1h0\dm", rows[1][3]) and re.fullmatch(r"\d+m\d\ds", rows[2][3])


def _expected_ranges(checkpoint: CompletedCheckpoint, operator: str) -> list[dict[str, Any]]:
    spans: dict[tuple[str, int], list[int]] = {}
    for subtask in checkpoint.subtasks_of(operator):
        assert subtask.keyed is not None
        for handle in subtask.keyed.changelog:
            assert isinstance(handle, KafkaChangelogHandle)
            for r in handle.ranges:
                span = spans.setdefault((handle.topic, r.partition), [r.start_offset,
                                                                      r.end_offset])
                span[0], span[1] = min(span[0], r.start_offset), max(span[1], r.end_offset)
    return [{"topic": t, "partition": p, "start_offset": s, "end_offset": e}
            for (t, p), (s, e) in sorted(spans.items())]


def test_checkpoints_shows_sizes_materializations_and_offsets(shop: Shop) -> None:
    shown = cli_json(*shop.args("checkpoints", "alpha"))
    assert shown["application"] == "alpha"
    assert [c["checkpoint_id"] for c in shown["checkpoints"]] == [1, 2]
    for summary, checkpoint in zip(shown["checkpoints"], shop.alpha_checkpoints, strict=True):
        assert summary["timestamp_ms"] == checkpoint.timestamp_ms
        assert summary["log_floors"] == [
            {"topic": f.topic, "partition": f.partition, "offset": f.offset}
            for f in checkpoint.log_floors]
        assert [o["operator"] for o in summary["operators"]] == ["by-id", "clicks", "regions"]
        for op in summary["operators"]:
            keyed = [s.keyed for s in checkpoint.subtasks_of(op["operator"])]
            assert all(k is not None and k.snapshot is not None for k in keyed)
            assert op["materialization_ids"] == sorted({k.materialization_id for k in keyed})
            assert op["snapshot_bytes"] == sum(c.size for k in keyed for c in k.snapshot.chunks)
            assert op["changelog_bytes"] == sum(h.state_size for k in keyed
                                                 for h in k.changelog)
            assert op["changelog"] == _expected_ranges(checkpoint, op["operator"])
            assert [s["key_groups"] for s in op["subtasks"]] == [
                [r.start, r.end] for r in ranges(op["parallelism"])]
    # Checkpoint 2 reuses checkpoint 1's materialization and adds a changelog tail.
    first, second = shown["checkpoints"]
    assert second["operators"][1]["materialization_ids"] == \
        first["operators"][1]["materialization_ids"]
    assert second["operators"][1]["changelog_bytes"] > first["operators"][1]["changelog_bytes"]
    table = cli(*shop.args("checkpoints", "beta"))
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert re.split(r"\s{2,}", header) == [
        "CHECKPOINT", "TIME", "BATCH", "OPERATOR", "P", "MATERIALIZATION", "SNAPSHOT",
        "CHANGELOG", "CHANGELOG_OFFSETS"]
    cells = re.split(r"\s{2,}", row)
    assert cells[:5] == ["1", when(shop.times["beta-1"]), "7", "clicks", "3"]
    assert cells[5].endswith("(3 ids)")
    spans = _expected_ranges(shop.beta_checkpoint, "clicks")
    assert cells[8] == ", ".join(
        f"{r['topic']}[{r['partition']}]:[{r['start_offset']},{r['end_offset']})" for r in spans)


def _state(shop: Shop, *args: str) -> dict[str, Any]:
    result = cli(*shop.args("state", *args, "--json"))
    assert result.returncode == 0, result.stderr
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def _values(shown: dict[str, Any]) -> dict[str, Any]:
    return {s["state"]: s["value"] for s in shown["states"]}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_state_of_a_string_key_is_decoded_by_serializer(shop: Shop) -> None:
    shown = _state(shop, "alpha", "--operator", "clicks", "--key", "user-3")
    group = kg(b"user-3")
    assert {k: v for k, v in shown.items() if k != "states"} == {
        "application": "alpha", "checkpoint_id": 2, "operator": "clicks",
        "key_hex": b"user-3".hex(), "key": ["user-3"], "key_types": ["string"],
        "key_group": group, "max_parallelism": MAX_P,
        "subtask": group * 2 // MAX_P, "parallelism": 2, "found": True}
    assert shown["states"] == [
        {"state": "blob", "kind": "value", "value_serializer": "bytes",
         "map_key_serializer": None, "value": {"base64": _b64(b"\x00\xff\x03")},
         "raw_base64": _b64(b"\x00\xff\x03")},
        {"state": "count", "kind": "value", "value_serializer": "int64",
         "map_key_serializer": None, "value": 23,
         "raw_base64": _b64((23).to_bytes(8, "big"))},
        {"state": "name", "kind": "value", "value_serializer": "utf8",
         "map_key_serializer": None, "value": "name-3", "raw_base64": _b64(b"name-3")},
        {"state": "pages", "kind": "map", "value_serializer": "int64",
         "map_key_serializer": "utf8", "value": {"home": 2, "p3": 3},
         "raw_base64": [[_b64(b"home"), _b64((2).to_bytes(8, "big"))],
                        [_b64(b"p3"), _b64((3).to_bytes(8, "big"))]]},
        {"state": "profile", "kind": "value", "value_serializer": "json",
         "map_key_serializer": None, "value": {"i": 3, "round": 2},
         "raw_base64": _b64(b'{"i":3,"round":2}')},
        {"state": "score", "kind": "value", "value_serializer": "float64",
         "map_key_serializer": None, "value": 3.5,
         "raw_base64": _b64(bytes.fromhex("400c000000000000"))},
        {"state": "tags", "kind": "list", "value_serializer": "utf8",
         "map_key_serializer": None, "value": ["r1", "r2"],
         "raw_base64": [_b64(b"r1"), _b64(b"r2")]},
    ]


def test_state_at_an_older_checkpoint_and_of_a_cleared_value(shop: Shop) -> None:
    older = _state(shop, "alpha", "--operator", "clicks", "--key", "user-3", "--checkpoint", "1")
    assert older["checkpoint_id"] == 1
    assert _values(older) == {
        "blob": {"base64": _b64(b"\x00\xff\x03")}, "count": 13, "name": "name-3",
        "pages": {"home": 1, "p3": 3}, "profile": {"i": 3, "round": 1}, "score": 3.25,
        "tags": ["r1"]}
    cleared = _state(shop, "alpha", "--operator", "clicks", "--key", "user-9")
    assert _values(cleared)["count"] is None  # cleared in round 2
    assert _values(cleared)["tags"] == ["r1", "r2"]
    assert next(s for s in cleared["states"] if s["state"] == "count")["raw_base64"] is None


def test_state_of_typed_and_composite_keys(shop: Shop) -> None:
    composite = _state(shop, "alpha", "--operator", "regions", "--key-type", "string,bigint",
                       "--key", "eu,7")
    assert composite["key_hex"] == region_key("eu", 7).hex()
    assert composite["key"] == ["eu", 7] and composite["key_types"] == ["string", "bigint"]
    assert composite["key_group"] == kg(region_key("eu", 7))
    assert _values(composite) == {"visits": 702}
    repeated = _state(shop, "alpha", "--operator", "regions", "--key-type", "string,bigint",
                      "--key", "eu", "--key", "7")
    assert repeated == composite
    by_id = _state(shop, "alpha", "--operator", "by-id", "--key-type", "bigint", "--key", "4")
    assert by_id["key_hex"] == id_key(4).hex() == "0000000000000004"
    assert _values(by_id) == {"label": "id-4"}
    as_hex = _state(shop, "alpha", "--operator", "clicks", "--key-hex", b"user-3".hex())
    by_name = _state(shop, "alpha", "--operator", "clicks", "--key", "user-3")
    # Hex alone says nothing of the key's type (this checkpoint records none).
    assert as_hex == {**by_name, "key": None, "key_types": None}


def test_state_keys_take_the_types_their_checkpoint_records(kafka_cluster: Any) -> None:
    """A Spark application records its key column types: ``--key 4`` finds a bigint key
    without ``--key-type``, an equivalent type is accepted, another refused by name."""
    topics = Topics.fresh()
    ids = Deployment(kafka_cluster, "ids", topics)
    try:
        ids.run_round(1, {"by-id": Operator(2, ids_work(6))}, 1, int(time.time() * 1000),
                      materialize=True, properties={"spark.key_types": '["bigint"]'})
    finally:
        ids.close()
    found = cli_json(*topics.cli_args(kafka_cluster), "state", "ids", "--operator", "by-id",
                     "--key", "4", "--json")
    assert (found["key"], found["key_types"], found["key_hex"]) == (
        [4], ["bigint"], id_key(4).hex())
    assert _values(found) == {"label": "id-4"}
    as_int = cli_json(*topics.cli_args(kafka_cluster), "state", "ids", "--operator", "by-id",
                      "--key-type", "int", "--key", "4", "--json")
    assert _values(as_int) == {"label": "id-4"} and as_int["key_types"] == ["int"]
    shown = cli(*topics.cli_args(kafka_cluster), "state", "ids", "--operator", "by-id",
                "--key-hex", id_key(5).hex())
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1].startswith(
        f"key 5 (bigint; 0x{id_key(5).hex()}): key group {kg(id_key(5))} of 128, subtask ")
    refused = cli(*topics.cli_args(kafka_cluster), "state", "ids", "--operator", "by-id",
                  "--key-type", "string", "--key", "4")
    assert refused.returncode == 2
    assert ("--key-type string: checkpoint 1 of application 'ids' records its key column "
            "type(s) as ['bigint'] (property spark.key_types); keys of type(s) ['string'] "
            "have other bytes and would not find their state. Omit --key-type to use the "
            "recorded type(s)") in refused.stderr
    bad = cli(*topics.cli_args(kafka_cluster), "state", "ids", "--operator", "by-id",
              "--key", "four")
    assert bad.returncode == 2
    assert "key value 'four' is not a bigint" in bad.stderr


def test_state_as_a_table(shop: Shop) -> None:
    result = cli(*shop.args("state", "beta", "--operator", "clicks", "--key", "b-2"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    group = kg(b"b-2")
    assert lines[0] == (f"application beta, checkpoint 1 ({when(shop.times['beta-1'])}), "
                        "operator clicks")
    assert lines[1] == (f"key \"b-2\" (string; 0x{b'b-2'.hex()}): key group {group} of 128, "
                        f"subtask {group * 3 // MAX_P} of 3")
    assert [re.split(r"\s{2,}", line) for line in lines[2:]] == [
        ["STATE", "KIND", "SERIALIZER", "VALUE"],
        ["blob", "value", "bytes", "0x00ff02"],
        ["count", "value", "int64", "12"],
        ["name", "value", "utf8", '"name-2"'],
        ["pages", "map", "utf8 -> int64", '{"home": 1, "p2": 2}'],
        ["profile", "value", "json", '{"i": 2, "round": 1}'],
        ["score", "value", "float64", "2.25"],
        ["tags", "list", "utf8", '["r1"]'],
    ]


def test_state_of_an_unknown_key_exits_1_and_bad_requests_exit_2(shop: Shop) -> None:
    missing = cli(*shop.args("state", "alpha", "--operator", "clicks", "--key", "nobody"))
    assert missing.returncode == 1
    assert (f"key \"nobody\" (string; 0x{b'nobody'.hex()}) has no state in operator 'clicks' "
            "at checkpoint 2 of application 'alpha'") in missing.stderr
    operator = cli(*shop.args("state", "alpha", "--operator", "nope", "--key", "x"))
    assert operator.returncode == 2
    assert ("checkpoint 2 of application 'alpha' has no operator 'nope'; its operators: "
            "by-id, clicks, regions") in operator.stderr
    # A double key is encoded (its state is looked up), a complex type refused.
    floating = cli(*shop.args("state", "alpha", "--operator", "clicks", "--key-type", "double",
                              "--key", "1.5"))
    assert floating.returncode == 1
    assert ("key 1.5 (double; 0x3ff8000000000000) has no state in operator 'clicks'"
            in floating.stderr)
    complex_key = cli(*shop.args("state", "alpha", "--operator", "clicks", "--key-type",
                                 "array<string>", "--key", "x"))
    assert complex_key.returncode == 2
    assert "has type array<string>, which cannot be a state key" in complex_key.stderr
    unknown = cli(*shop.args("state", "omega", "--operator", "clicks", "--key", "x"))
    assert unknown.returncode == 2
    assert (f"application 'omega' has no checkpoint in checkpoint topic "
            f"{shop.topics.checkpoint}; applications with checkpoints there: alpha, beta"
            ) in unknown.stderr
    old = cli(*shop.args("state", "alpha", "--operator", "clicks", "--key", "x",
                         "--checkpoint", "9"))
    assert old.returncode == 2
    assert "application 'alpha' has no checkpoint 9 in checkpoint topic" in old.stderr
    assert "stored checkpoints: 1, 2" in old.stderr


def _expected_verify(checkpoint: CompletedCheckpoint, models: dict[str, Model]
                     ) -> list[dict[str, Any]]:
    expected = []
    for operator in checkpoint.operators():
        for subtask in checkpoint.subtasks_of(operator):
            keyed = subtask.keyed
            assert keyed is not None and keyed.snapshot is not None
            key_groups = keyed.key_group_range
            expected.append({
                "operator": operator, "subtask": subtask.subtask_index,
                "key_groups": [key_groups.start, key_groups.end],
                **expected_sizes(models[operator], key_groups),
                "snapshot_bytes": keyed.snapshot.state_size,
                "changelog_bytes": sum(h.state_size for h in keyed.changelog),
                "ok": True, "problem": None})
    return expected


def test_verify_restores_every_subtask_and_reports_sizes(shop: Shop) -> None:
    result = cli(*shop.args("verify", "alpha", "--json"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for subtask in report["subtasks"]:
        assert subtask.pop("changelog_records_read") > 0
    models = {name: op.model for name, op in shop.alpha.items()}
    assert report == {"application": "alpha", "checkpoint_id": 2, "ok": True, "problems": [],
                      "notes": [],
                      "subtasks": _expected_verify(shop.alpha_checkpoints[1], models)}
    keys: dict[str, int] = {}
    for subtask in report["subtasks"]:
        keys[subtask["operator"]] = keys.get(subtask["operator"], 0) + subtask["keys"]
    assert keys == {"by-id": 6, "clicks": 10, "regions": 8}  # every key, exactly once
    older = cli(*shop.args("verify", "alpha", "--checkpoint", "1", "--json"))
    assert older.returncode == 0, older.stderr
    first = json.loads(older.stdout)
    for subtask in first["subtasks"]:
        subtask.pop("changelog_records_read")
    assert first["subtasks"] == _expected_verify(shop.alpha_checkpoints[0], shop.alpha_round1)
    # Progress goes to stderr, one line per subtask.
    assert "verify: operator 'regions' subtask 1 (key groups 64-127), 5 of 5" in result.stderr
    table = cli(*shop.args("verify", "beta"))
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[-1] == (
        f"all 3 subtask(s) restored: 6 keys, "
        f"{sum(expected_sizes(shop.beta['clicks'].model, r)['state_bytes'] for r in ranges(3))}"
        " B of state")


def test_read_only_commands_create_and_write_nothing(shop: Shop) -> None:
    before = end_offsets(shop.cluster, shop.topics.all())
    topics_before = set(shop.cluster.admin_client().list_topics(timeout=10).topics)
    for args in (["applications"], ["checkpoints", "alpha"], ["verify", "alpha"],
                 ["state", "alpha", "--operator", "clicks", "--key", "user-1"]):
        result = cli(*shop.args(*args))
        assert result.returncode == 0, (args, result.stderr)
    assert end_offsets(shop.cluster, shop.topics.all()) == before
    assert set(shop.cluster.admin_client().list_topics(timeout=10).topics) == topics_before
    missing = cli(*shop.topics.cli_args(shop.cluster), "--checkpoint-topic", "no-such-cp",
                  "applications")
    assert missing.returncode == 2
    assert "checkpoint topic 'no-such-cp' does not exist on" in missing.stderr
    assert "no-such-cp" not in shop.cluster.admin_client().list_topics(timeout=10).topics


# -- verify finds missing data --------------------------------------------------------------


@dataclass
class Victim:
    cluster: Any
    topics: Topics
    checkpoint: CompletedCheckpoint

    def args(self, *args: str) -> list[str]:
        return [*self.topics.cli_args(self.cluster), *args]


@pytest.fixture
def victim(kafka_cluster: Any) -> Iterator[Victim]:
    """An application whose latest checkpoint has a snapshot and a changelog tail."""
    topics = Topics.fresh()
    operators = {"clicks": Operator(2, clicks_work("user", 10))}
    deployment = Deployment(kafka_cluster, "victim", topics)
    try:
        deployment.run_round(1, operators, 1, int(time.time() * 1000), materialize=True)
        latest = deployment.run_round(2, operators, 2, int(time.time() * 1000),
                                      materialize=False)
        yield Victim(kafka_cluster, topics, latest)
    finally:
        deployment.close()


def _delete_below(cluster: Any, topic: str, partition: int, offset: int) -> None:
    admin = cluster.admin_client()  # kept until its futures are done
    futures = admin.delete_records([TopicPartition(topic, partition, offset)])
    for future in futures.values():
        future.result(30)


def _verify_problems(victim: Victim, count: int = 1) -> dict[str, Any]:
    result = cli(*victim.args("verify", "victim", "--json"))
    assert result.returncode == 1, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert not report["ok"]
    assert (f"verify: {count} problem(s) in checkpoint 2 of application 'victim'"
            in result.stderr)
    return report


def test_verify_fails_on_a_truncated_changelog_naming_it(victim: Victim) -> None:
    keyed = victim.checkpoint.subtasks_of("clicks")[1].keyed
    assert keyed is not None
    tail = keyed.changelog[-1]
    assert isinstance(tail, KafkaChangelogHandle)
    (span,) = [r for r in tail.ranges if r.partition == 1]
    cut = span.start_offset + 1
    _delete_below(victim.cluster, victim.topics.changelog, 1, cut)
    # Handles are read in order: the first range the cut removed anything of is named.
    needed = next(r.start_offset for h in keyed.changelog
                  for r in h.ranges  # type: ignore[attr-defined]
                  if r.partition == 1 and r.start_offset < min(cut, r.end_offset))
    report = _verify_problems(victim)
    problem = (f"operator 'clicks' subtask 1 (key groups 64-127): ChangelogTruncatedError: "
               f"changelog {victim.topics.changelog}[1] was truncated: the handle needs offset "
               f"{needed} but the log starts at offset {cut}")
    assert report["problems"] == [problem]
    assert [(s["subtask"], s["ok"]) for s in report["subtasks"]] == [(0, True), (1, False)]
    table = cli(*victim.args("verify", "victim"))
    assert table.returncode == 1
    assert table.stdout.splitlines()[-2:] == ["1 problem(s):", f"- {problem}"]
    assert re.split(r"\s{2,}", table.stdout.splitlines()[3])[-1] == "FAILED"


def test_verify_fails_on_a_deleted_snapshot_chunk_naming_it(victim: Victim) -> None:
    keyed = victim.checkpoint.subtasks_of("clicks")[0].keyed
    assert keyed is not None and keyed.snapshot is not None
    chunk = keyed.snapshot.chunks[0]  # the lowest key group's: the lowest offset
    assert chunk.partition == 0
    _delete_below(victim.cluster, victim.topics.snapshot, 0, chunk.offset + 1)
    _, high = end_offsets(victim.cluster, [victim.topics.snapshot])[(victim.topics.snapshot, 0)]
    report = _verify_problems(victim)
    assert report["problems"] == [
        f"operator 'clicks' subtask 0 (key groups 0-63): SnapshotMissingError: snapshot chunk "
        f"0 of key group {chunk.key_group} (backend {keyed.snapshot.backend_id}, "
        f"materialization {chunk.materialization_id}) at {victim.topics.snapshot}[0]"
        f"@{chunk.offset} is missing: found no record at offset {chunk.offset}: the log holds "
        f"offsets {chunk.offset + 1} to {high - 1} (deleted records or a recreated topic). "
        "The chunk was deleted (its snapshot was discarded) or the topic lost data; the "
        "snapshot cannot be restored"]
    assert [(s["subtask"], s["ok"]) for s in report["subtasks"]] == [(0, False), (1, True)]


def test_verify_names_a_missing_topic(victim: Victim) -> None:
    admin = victim.cluster.admin_client()
    for future in admin.delete_topics([victim.topics.snapshot]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while victim.topics.snapshot in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    report = _verify_problems(victim, 3)
    assert report["problems"] == [
        f"topic '{victim.topics.snapshot}', which the checkpoint's handles name, does not "
        f"exist on {victim.cluster.bootstrap_servers}",
        f"operator 'clicks' subtask 0 (key groups 0-63): not restored: topic(s) "
        f"{victim.topics.snapshot} do not exist",
        f"operator 'clicks' subtask 1 (key groups 64-127): not restored: topic(s) "
        f"{victim.topics.snapshot} do not exist"]
