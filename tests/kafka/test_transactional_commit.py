"""Checkpoint + outputs in one Kafka transaction, against a real broker (kill -9 included)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.transaction_calls import TransactionFencedError
from kafka_changelog.kafka.transactional_commit import OutputRecord, TransactionalCommitter
from kafka_changelog.state.checkpoints.checkpoint import (
    CompletedCheckpoint,
    OperatorStateHandle,
    SubtaskState,
)
from kafka_changelog.state.errors import CheckpointOrderError

pytestmark = pytest.mark.broker


def store_config(cluster: Any) -> CheckpointStoreConfig:
    settings = dict(cluster.client_config())
    return CheckpointStoreConfig(
        bootstrap_servers=settings.pop("bootstrap.servers"), client_config=settings,
        topic=f"txn-checkpoints-{uuid.uuid4().hex[:10]}", request_timeout_s=20.0)


def checkpoint(cid: int) -> CompletedCheckpoint:
    source = OperatorStateHandle("src", 0, {"offsets": (str(cid).encode(),)}, {})
    return CompletedCheckpoint("app", cid, 1_700_000_000_000 + cid, 128,
                               (SubtaskState("src", 0, 1, None, source),))


def outputs(topic: str, step: int) -> list[OutputRecord]:
    return [OutputRecord(topic, f"step {step} row {i}".encode(), f"k{i}".encode())
            for i in range(3)]


def read_all(cluster: Any, topic: str, isolation: str = "read_committed") -> list[bytes]:
    consumer = Consumer({**cluster.client_config(), "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        while True:
            message = consumer.poll(10)
            assert message is not None, f"no end of partition {topic}[0] within 10 s"
            if message.error() is not None:
                break  # end of partition (enable.partition.eof)
            values.append(message.value() or b"")
        return values
    finally:
        consumer.close()


def test_outputs_become_visible_with_their_checkpoint(kafka_cluster: Any, make_topic: Any) -> None:
    config = store_config(kafka_cluster)
    topic = make_topic()
    with KafkaCheckpointStore(config) as store, TransactionalCommitter(
        store, f"tx-{config.topic}"
    ) as committer:
        committer.commit(checkpoint(1), outputs(topic, 1))
        committer.commit(checkpoint(2), outputs(topic, 2))
        assert committer.commits == 2
        with pytest.raises(CheckpointOrderError):
            committer.commit(checkpoint(2), outputs(topic, 99))
    assert read_all(kafka_cluster, topic) == [
        f"step {s} row {i}".encode() for s in (1, 2) for i in range(3)]
    with KafkaCheckpointStore(config) as fresh:
        assert fresh.latest("app") == checkpoint(2)


def sink_check_fails() -> None:
    """A step's last check before its transaction commits, failing."""
    raise RuntimeError("the sink's check failed")


def test_a_failing_step_aborts_its_outputs(kafka_cluster: Any, make_topic: Any) -> None:
    config = store_config(kafka_cluster)
    topic = make_topic()

    with KafkaCheckpointStore(config) as store, TransactionalCommitter(
        store, f"tx-{config.topic}"
    ) as committer:
        committer.commit(checkpoint(1), outputs(topic, 1))
        with pytest.raises(RuntimeError, match="the sink's check failed"):
            committer.commit(checkpoint(2), outputs(topic, 2), before_commit=sink_check_fails)
        assert store.latest("app") == checkpoint(1)
        committer.commit(checkpoint(2), outputs(topic, 3))
    assert read_all(kafka_cluster, topic) == [
        f"step {s} row {i}".encode() for s in (1, 3) for i in range(3)]


class _AbortFails:
    """A committer's real producer whose next ``abort_transaction`` fails with ``error``
    (as librdkafka's does with INVALID_TXN_STATE after a coordinator moved, its issue
    #4849): everything else goes to the broker."""

    def __init__(self, producer: Any, error: KafkaError) -> None:
        self._producer, self._error = producer, error

    def abort_transaction(self, *_args: Any) -> None:
        raise KafkaException(self._error)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def test_a_step_whose_abort_fails_reports_its_own_error_and_the_next_commits(
    kafka_cluster: Any, make_topic: Any
) -> None:
    config = store_config(kafka_cluster)
    topic = make_topic()

    with KafkaCheckpointStore(config) as store, TransactionalCommitter(
        store, f"tx-{config.topic}"
    ) as committer:
        committer.commit(checkpoint(1), outputs(topic, 1))
        first = committer._producer
        committer._producer = _AbortFails(first, KafkaError(
            KafkaError.INVALID_TXN_STATE, "abort in a state it cannot", fatal=True))
        with pytest.raises(RuntimeError, match="the sink's check failed"):
            committer.commit(checkpoint(2), outputs(topic, 2), before_commit=sink_check_fails)
        assert committer._producer is not first  # a new one aborted what was open
        assert store.latest("app") == checkpoint(1)
        committer.commit(checkpoint(2), outputs(topic, 3))
    assert read_all(kafka_cluster, topic) == [
        f"step {s} row {i}".encode() for s in (1, 3) for i in range(3)]


def test_an_abort_refused_as_fenced_stays_fenced(kafka_cluster: Any, make_topic: Any) -> None:
    config = store_config(kafka_cluster)
    topic = make_topic()

    with KafkaCheckpointStore(config) as store, TransactionalCommitter(
        store, f"tx-{config.topic}"
    ) as committer:
        committer._producer = _AbortFails(committer._producer, KafkaError(
            KafkaError.PRODUCER_FENCED, "fenced by a newer producer", fatal=True))
        with pytest.raises(TransactionFencedError, match="aborting a transaction") as caught:
            committer.commit(checkpoint(1), outputs(topic, 1), before_commit=sink_check_fails)
        assert isinstance(caught.value.__cause__, RuntimeError)
        with pytest.raises(TransactionFencedError):
            committer.commit(checkpoint(1), outputs(topic, 1))
    assert read_all(kafka_cluster, topic) == []


class _PollRaises:
    """A committer's real producer already fenced as seen under load: its ``produce`` fails
    with librdkafka's bare fatal error, and ``poll`` raises ``error``, the fencing, instead
    of serving the error callback. Everything else goes to the broker."""

    def __init__(self, producer: Any, error: KafkaError) -> None:
        self._producer, self._error = producer, error

    def produce(self, *_args: Any, **_kwargs: Any) -> None:
        raise KafkaException(KafkaError(KafkaError._FATAL,
                                        "Unable to produce message: Local: Fatal error"))

    def poll(self, *_args: Any) -> int:
        raise KafkaException(self._error)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


@contextmanager
def two_committers(kafka_cluster: Any) -> Iterator[
        tuple[TransactionalCommitter, TransactionalCommitter, str]]:
    """An older and a newer committer of one transactional id (the newer one fenced the
    older at its start), and that id; both closed after."""
    config = store_config(kafka_cluster)
    tid = f"tx-{config.topic}"
    with KafkaCheckpointStore(config) as store:
        old = TransactionalCommitter(store, tid)
        new = TransactionalCommitter(store, tid)
        try:
            yield old, new, tid
        finally:
            new.close()
            old.close()


def test_a_fencing_raised_by_poll_is_reported_as_the_fencing(
        kafka_cluster: Any, make_topic: Any) -> None:
    topic = make_topic()
    with two_committers(kafka_cluster) as (old, new, _):
        old._producer = _PollRaises(old._producer, KafkaError(
            KafkaError._FENCED, "fenced by a newer instance", fatal=True))
        with pytest.raises(TransactionFencedError, match="another committer with this "
                           "transactional id took over"):
            old.commit(checkpoint(1), outputs(topic, 1))
        new.commit(checkpoint(1), outputs(topic, 0))
    assert read_all(kafka_cluster, topic) == [f"step 0 row {i}".encode() for i in range(3)]


CRASHING_CHILD = textwrap.dedent("""
    import os, signal, sys
    from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
    from kafka_changelog.kafka.transactional_commit import OutputRecord, TransactionalCommitter
    from tests.kafka.test_transactional_commit import checkpoint, outputs
    bootstrap, topic, out, tid = sys.argv[1:5]
    store = KafkaCheckpointStore(CheckpointStoreConfig(bootstrap_servers=bootstrap, topic=topic))
    committer = TransactionalCommitter(store, tid)
    def crash():
        committer._producer.flush(30)  # the open transaction's records reach the broker
        os.kill(os.getpid(), signal.SIGKILL)
    committer.commit(checkpoint(2), outputs(out, 2), before_commit=crash)
""")


def test_kill_9_inside_the_transaction_leaves_nothing_visible(
    kafka_cluster: Any, make_topic: Any
) -> None:
    config = store_config(kafka_cluster)
    topic = make_topic()
    tid = f"tx-{config.topic}"
    with KafkaCheckpointStore(config) as store, TransactionalCommitter(store, tid) as committer:
        committer.commit(checkpoint(1), outputs(topic, 1))
    child = subprocess.run(
        [sys.executable, "-c", CRASHING_CHILD, config.bootstrap_servers, config.topic, topic,
         tid], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    # The dead transaction is open, its records are in the log (read_uncommitted sees
    # them) and read_committed readers stop before it without hanging.
    assert read_all(kafka_cluster, topic, "read_uncommitted") == [
        f"step {s} row {i}".encode() for s in (1, 2) for i in range(3)]
    with KafkaCheckpointStore(config) as reader:
        assert reader.latest("app") == checkpoint(1)
    assert read_all(kafka_cluster, topic) == [f"step 1 row {i}".encode() for i in range(3)]
    # The restarted committer fences the dead one and aborts its transaction.
    with KafkaCheckpointStore(config) as store, TransactionalCommitter(store, tid) as committer:
        assert store.latest("app") == checkpoint(1)
        committer.commit(checkpoint(2), outputs(topic, 2))
    assert read_all(kafka_cluster, topic) == [
        f"step {s} row {i}".encode() for s in (1, 2) for i in range(3)]
    with KafkaCheckpointStore(config) as fresh:
        assert fresh.latest("app") == checkpoint(2)


@pytest.mark.parametrize("attempts", [1, 3])
def test_an_older_committer_is_fenced(kafka_cluster: Any, make_topic: Any,
                                      attempts: int) -> None:
    """Fenced at its first commit, and at every later one: once librdkafka has seen the
    fencing, its calls fail with a bare fatal error (or a "conflicting call"); the
    committer still says it was fenced, and commits nothing."""
    topic = make_topic()
    with two_committers(kafka_cluster) as (old, new, tid):
        for attempt in range(1, attempts + 1):
            with pytest.raises(TransactionFencedError, match=(
                    f"transactional id '{tid}'.*another committer with this transactional "
                    "id took over")):
                old.commit(checkpoint(1), outputs(topic, attempt))
        new.commit(checkpoint(1), outputs(topic, 0))
    assert read_all(kafka_cluster, topic) == [f"step 0 row {i}".encode() for i in range(3)]
