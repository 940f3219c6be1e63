"""A task's outputs and its part of a checkpoint in one transaction of its own.

Against a real broker: two attempts of one subtask never both publish outputs (the
later producer fences the earlier one, and a fenced attempt looks again before it
commits); a retry finds the earlier attempt's commit; a zombie's open transaction is
aborted; and the driver's view sees every subtask commit even behind another
producer's open transaction.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.task_commit import (
    OutputTopicMissingError,
    SubtaskCommitter,
    check_output_topics,
    fence,
)
from kafka_changelog.kafka.transactional_commit import OutputRecord
from kafka_changelog.state.checkpoints.subtask_commit import SubtaskCommit

pytestmark = pytest.mark.broker

APP, OPERATOR = "orders", "totals"


@pytest.fixture
def names(kafka_cluster: Any, make_topic: Any) -> Iterator[tuple[CheckpointStoreConfig, str]]:
    config = CheckpointStoreConfig(bootstrap_servers=kafka_cluster.bootstrap_servers,
                                   topic=f"tc-{uuid.uuid4().hex[:8]}-checkpoints")
    KafkaCheckpointStore(config).close()  # creates the topic
    yield config, make_topic()


def a_commit(subtask: int = 0, checkpoint_id: int = 7, batch_id: int = 3,
             marker: str = "a") -> SubtaskCommit:
    return SubtaskCommit(APP, OPERATOR, checkpoint_id, subtask, 2, batch_id, "query-1",
                         int(time.time() * 1000), 2, b"state-" + marker.encode(),
                         f'{{"marker": "{marker}"}}')


def outputs(topic: str, marker: str) -> list[OutputRecord]:
    return [OutputRecord(topic, f"{marker}-{i}".encode()) for i in range(2)]


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values = []
        while True:
            message = consumer.poll(10)
            assert message is not None, f"no end of {topic} within 10 s"
            if message.error():
                break  # the partition's end
            values.append(message.value())
        return values
    finally:
        consumer.close()


def same(commit: SubtaskCommit) -> Any:
    return lambda found: found.is_for(APP, OPERATOR, commit.checkpoint_id, commit.batch_id,
                                      commit.query_id)


def test_a_retry_finds_the_earlier_attempts_commit(
        names: tuple[CheckpointStoreConfig, str], kafka_cluster: Any) -> None:
    config, output = names
    first = SubtaskCommitter(config, "tid-0")
    commit = a_commit(marker="first")
    assert first.find(commit.key, 0, same(commit)) is None
    holding, ours = first.commit(outputs(output, "first"), commit, 0)
    assert ours and holding == commit
    first.close()
    retry = SubtaskCommitter(config, "tid-0")
    try:
        assert retry.find(commit.key, 0, same(commit)) == commit
        # Another batch's commit of the same subtask is not this one.
        assert retry.find(commit.key, 0, same(a_commit(batch_id=4))) is None
    finally:
        retry.close()
    assert committed_values(kafka_cluster.bootstrap_servers, output) == [b"first-0", b"first-1"]


def test_two_racing_attempts_publish_the_outputs_once(
        names: tuple[CheckpointStoreConfig, str], kafka_cluster: Any) -> None:
    config, output = names
    early, late = SubtaskCommitter(config, "tid-1"), SubtaskCommitter(config, "tid-1")
    try:
        commit_a, commit_b = a_commit(1, marker="a"), a_commit(1, marker="b")
        assert early.find(commit_a.key, 0, same(commit_a)) is None
        assert late.find(commit_b.key, 0, same(commit_b)) is None  # fences early
        # early is fenced: it takes the id back, looks again, finds nothing, commits.
        holding, ours = early.commit(outputs(output, "a"), commit_a, 0)
        assert ours and holding == commit_a and early.fenced == 1
        # late is fenced now: it looks again and finds early's commit.
        holding, ours = late.commit(outputs(output, "b"), commit_b, 0)
        assert not ours and holding == commit_a and late.fenced == 1
    finally:
        early.close()
        late.close()
    assert committed_values(kafka_cluster.bootstrap_servers, output) == [b"a-0", b"a-1"]


def test_a_zombies_open_transaction_is_aborted(
        names: tuple[CheckpointStoreConfig, str], kafka_cluster: Any) -> None:
    config, output = names
    zombie = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers,
                       "transactional.id": "tid-2"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(output, b"zombie")
    zombie.flush(30)
    fence(config, ["tid-2"])
    committer = SubtaskCommitter(config, "tid-2")
    try:
        commit = a_commit(2, marker="c")
        assert committer.commit(outputs(output, "c"), commit, 0) == (commit, True)
    finally:
        committer.close()
    assert committed_values(kafka_cluster.bootstrap_servers, output) == [b"c-0", b"c-1"]


def test_the_driver_sees_commits_behind_an_open_transaction(
        names: tuple[CheckpointStoreConfig, str], kafka_cluster: Any) -> None:
    config, output = names
    store = KafkaCheckpointStore(config)
    other = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers,
                      "transactional.id": "another-application"})
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(config.topic, key=b"another/guard/" + b"0" * 32, value=None)
    other.flush(30)
    committer = SubtaskCommitter(config, "tid-3")
    try:
        commit = a_commit(3, marker="d")
        committer.commit(outputs(output, "d"), commit, 0)
        # The commit lies behind the other transaction: a plain refresh stops before it.
        assert store.subtask_commits(APP, OPERATOR) == {}
        finisher = threading.Timer(2.0, lambda: other.commit_transaction(30))
        finisher.start()
        store.catch_up(30)
        finisher.join()
        assert store.subtask_commits(APP, OPERATOR) == {3: commit}
        # A restarted driver reads the same from the topic.
        fresh = KafkaCheckpointStore(config)
        try:
            assert fresh.subtask_commits(APP, OPERATOR) == {3: commit}
            assert fresh.applications() == []  # commits are not checkpoints
        finally:
            fresh.close()
    finally:
        committer.close()
        store.close()


def test_a_missing_output_topic_is_named_before_any_transaction(
        names: tuple[CheckpointStoreConfig, str]) -> None:
    config, topic = names
    check_output_topics(config, [topic])  # exists: no error
    missing = f"{topic}-not-created"
    with pytest.raises(OutputTopicMissingError) as raised:
        check_output_topics(config, [topic, missing])
    assert str(raised.value) == (
        f"output topic {missing!r} does not exist on {config.bootstrap_servers} and its "
        "brokers do not create topics on first use (auto.create.topics.enable=false): "
        f"create it first, e.g. kafka-topics.sh --create --topic {missing}")


def test_committers_of_two_workers_take_turns_batch_after_batch(
        names: tuple[CheckpointStoreConfig, str], kafka_cluster: Any) -> None:
    """Spark hands a subtask's tasks to whichever Python worker is free: each worker keeps
    its committer of the subtask's id, so every task of the other worker finds its own
    producer fenced and takes the id back, batch after batch: before its transaction (the
    owner file of the machine), not by a failed one (a fatal librdkafka state)."""
    config, output = names
    workers = [SubtaskCommitter(config, "tid-turns"), SubtaskCommitter(config, "tid-turns")]
    try:
        for batch in range(8):
            committer = workers[batch % 2]
            commit = a_commit(2, checkpoint_id=batch + 1, batch_id=batch, marker=f"b{batch}")
            assert committer.find(commit.key, 0, same(commit)) is None
            holding, ours = committer.commit(outputs(output, f"b{batch}"), commit, 0)
            assert ours and holding == commit, batch
        # Each task after its worker's first took the id back before its transaction.
        assert sum(w.fenced for w in workers) == 0
        assert sum(w.commits for w in workers) == 8
    finally:
        for worker in workers:
            worker.close()
    assert committed_values(kafka_cluster.bootstrap_servers, output) == [
        f"b{batch}-{i}".encode() for batch in range(8) for i in range(2)]
