"""``fork``: the records it writes on a real broker, its refusals (exact messages, exit
code 2), and a second run finishing an interrupted fork."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kafka_changelog.cli.fork import end_offsets as fork_end_offsets
from kafka_changelog.cli.main import main
from kafka_changelog.cli.options import Connection
from kafka_changelog.kafka import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.producer import AckedProducer
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.errors import CheckpointStoreError
from kafka_changelog.state.history.fork import (
    FORK_APPLICATION,
    FORK_CHECKPOINT,
    ForkRequest,
    plan_fork,
)

from .cli_helpers import (
    Deployment,
    Operator,
    Topics,
    cli,
    clicks_work,
    end_offsets,
    stored_checkpoints,
)

pytestmark = pytest.mark.broker


@dataclass
class Blue:
    """Application blue: three checkpoints (the first two materialized), retain 3."""

    cluster: Any
    topics: Topics
    checkpoints: list[CompletedCheckpoint]

    def args(self, *args: str) -> list[str]:
        return [*self.topics.cli_args(self.cluster), *args]


@pytest.fixture(scope="module")
def blue(kafka_cluster: Any) -> Iterator[Blue]:
    topics = Topics.fresh()
    deployment = Deployment(kafka_cluster, "blue", topics)
    try:
        ops = {"clicks": Operator(2, clicks_work("user", 8))}
        cps = [deployment.run_round(i, ops, min(i, 2), 1000 * i, materialize=i < 3)
               for i in (1, 2, 3)]
        yield Blue(kafka_cluster, topics, cps)
    finally:
        deployment.close()


def run(blue: Blue, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    """The JSON output of a command that succeeds (run in this process)."""
    capsys.readouterr()
    assert main(blue.args(*args)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def refused(blue: Blue, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The error of a refused fork (run in this process: no interpreter start per call;
    ``cli`` runs the same ``main``)."""
    capsys.readouterr()
    assert main(blue.args("fork", *args)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err.strip()


def test_fork_at_latest_and_at_a_checkpoint_then_again(
        blue: Blue, capsys: pytest.CaptureFixture[str]) -> None:
    result = cli(*blue.args("fork", "blue", "green"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"forked application blue at checkpoint 3 to green (checkpoint topic "
        f"{blue.topics.checkpoint}); its next checkpoint is 4",
        f"  run green with checkpoint_topic='{blue.topics.checkpoint}', changelog_topic="
        f"{blue.topics.changelog}, snapshot_topic={blue.topics.snapshot}"]
    (green,) = stored_checkpoints(blue.cluster, blue.topics, "green")
    source = blue.checkpoints[2]
    assert green.checkpoint_id == 3 and green.timestamp_ms == source.timestamp_ms
    assert green.properties == {FORK_APPLICATION: "blue", FORK_CHECKPOINT: "3"}
    assert [(s.operator_id, s.subtask_index, s.keyed.snapshot, s.keyed.changelog)
            for s in green.subtasks if s.keyed is not None] == [
        (s.operator_id, s.subtask_index, s.keyed.snapshot, s.keyed.changelog)
        for s in source.subtasks if s.keyed is not None]
    # Log floors: the changelog's end when forked (no higher than blue's own floors).
    ends = end_offsets(blue.cluster, [blue.topics.changelog])
    assert {(f.topic, f.partition): f.offset for f in green.log_floors} == {
        tp: min(end, *(f.offset for f in source.log_floors if (f.topic, f.partition) == tp))
        for tp, (_, end) in ends.items()}

    # The rest in this process (the same main, without an interpreter start per call).
    assert run(blue, capsys, "fork", "blue", "green", "--json")["outcome"] == "already-forked"
    summary = run(blue, capsys, "fork", "blue", "teal", "--checkpoint", "2", "--json")
    assert {k: summary[k] for k in ("application", "new_application", "checkpoint_id",
                                    "outcome")} == {
        "application": "blue", "new_application": "teal", "checkpoint_id": 2,
        "outcome": "created"}
    (teal_checkpoint,) = stored_checkpoints(blue.cluster, blue.topics, "teal")
    assert teal_checkpoint.checkpoint_id == 2

    # Verify restores every subtask of the fork from blue's data.
    capsys.readouterr()
    assert main(blue.args("verify", "teal")) == 0, capsys.readouterr()

    assert refused(blue, capsys, "blue", "green", "--checkpoint", "2") == (
        f"kafka-changelog: error: application 'green' exists already in checkpoint topic "
        f"{blue.topics.checkpoint} (checkpoints 3): a fork starts a new application; choose "
        "another name, or delete it first with 'kafka-changelog reset green --yes'")


def test_refusals(blue: Blue, capsys: pytest.CaptureFixture[str]) -> None:
    where = blue.topics.checkpoint
    assert refused(blue, capsys, "blue", "blue") == (
        "kafka-changelog: error: cannot fork application 'blue' onto itself: name a new "
        "application to fork it to")
    unknown = refused(blue, capsys, "nobody", "x")
    assert unknown.startswith(
        f"kafka-changelog: error: application 'nobody' is unknown in checkpoint topic "
        f"{where}; applications there: blue")
    assert refused(blue, capsys, "blue", "x", "--checkpoint", "1", "--retain", "2") == (
        "kafka-changelog: error: checkpoint 1 of application 'blue' is not retained "
        "(retained, with retain=2: 2, 3): its data may be garbage collected already; fork "
        "from a retained checkpoint")
    assert refused(blue, capsys, "blue", "x", "--checkpoint", "9") == (
        "kafka-changelog: error: checkpoint 9 of application 'blue' is not retained "
        "(retained, with retain=3: 1, 2, 3): its data may be garbage collected already; "
        "fork from a retained checkpoint")
    assert stored_checkpoints(blue.cluster, blue.topics, "x") == []


def test_a_second_run_finishes_an_interrupted_fork(
        blue: Blue, capsys: pytest.CaptureFixture[str]) -> None:
    settings = dict(blue.cluster.client_config())
    connected = Connection(settings.pop("bootstrap.servers"), settings)
    config = CheckpointStoreConfig(bootstrap_servers=connected.bootstrap_servers,
                                   client_config=settings, topic=blue.topics.checkpoint)
    with KafkaCheckpointStore(config) as store:
        plan = plan_fork(store, ForkRequest("blue", "amber", 2), store.topic,
                         lambda topics: fork_end_offsets(connected, topics))
    # The first run wrote NEW's checkpoint, and died before the pointer.
    producer = AckedProducer(config.producer(), config.topic, CheckpointStoreError, 30)
    try:
        producer.produce_all(plan.checkpoint_records, "the interrupted fork's checkpoint")
    finally:
        producer.close(30)
    capsys.readouterr()
    assert main(blue.args("fork", "blue", "amber")) == 0  # as the user ran it first
    assert capsys.readouterr().out.splitlines()[0] == (
        f"completed the interrupted fork of application blue at checkpoint 2 to amber "
        f"(checkpoint topic {blue.topics.checkpoint}); its next checkpoint is 3")
    with KafkaCheckpointStore(config) as store:
        assert store.has_pointer("amber")
        assert store.latest("amber") == plan.forked
