"""A fenced transactional producer is let go even when librdkafka raises its fatal error.

librdkafka puts a fenced producer in a fatal state, and ``flush`` then may raise that
error (a fresh-clone CI run saw it in a Spark task: the task failed instead of taking
the transactional id back). The committer must drop the producer and go on. The
producer here is a stand-in whose ``flush`` raises as librdkafka's did: the point is
our handling of that error, not Kafka's behaviour (the fencing itself is exercised
against a real broker in ``test_task_commit.py``).
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig
from kafka_changelog.kafka.task_commit import SubtaskCommitter


class _FencedProducer:
    def __init__(self) -> None:
        self.flushes = 0
        self.closed = False

    def flush(self, timeout: float = -1) -> int:
        self.flushes += 1
        raise KafkaException(KafkaError(KafkaError._FENCED, "Failed to add partitions to "
                                        "transaction: fenced by a newer instance", fatal=True))

    def purge(self) -> None:
        """Nothing queued: the fenced producer delivered or lost everything."""

    def close(self) -> None:
        self.closed = True


def test_a_fenced_producer_is_dropped_without_raising() -> None:
    # No broker: the committer's consumers are never used (and kept quiet).
    config = CheckpointStoreConfig(bootstrap_servers="127.0.0.1:1",
                                   client_config={"log_level": 0})
    committer = SubtaskCommitter(config, "tid-fenced")
    fenced = _FencedProducer()
    committer._producer = fenced  # type: ignore[assignment]
    try:
        committer._drop_producer()
        # Flushed for the last time (raising), then once more after the purge, and closed.
        assert fenced.flushes >= 1 and fenced.closed and committer._producer is None
    finally:
        committer.close()
