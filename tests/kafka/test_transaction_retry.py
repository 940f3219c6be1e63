"""A broker slow to answer a transactional call: the call is made again within the
connection's ``retry_bound_s``, then fails naming the call and the wait."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig
from kafka_changelog.kafka.task_commit import SubtaskCommitter, fence
from kafka_changelog.kafka.transaction_calls import TransactionCallTimeoutError
from kafka_changelog.local_kafka.broker import LocalKafkaCluster

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def pausable_cluster() -> Iterator[LocalKafkaCluster]:
    """A broker of its own: pausing the shared one would stall other tests."""
    with LocalKafkaCluster(nodes=1) as cluster:
        yield cluster


def _config(cluster: LocalKafkaCluster, retry_bound_s: float) -> CheckpointStoreConfig:
    return CheckpointStoreConfig(bootstrap_servers=cluster.bootstrap_servers,
                                 request_timeout_s=2.0, retry_bound_s=retry_bound_s)


def test_init_transactions_outlasts_a_broker_paused_past_its_timeout(
    pausable_cluster: LocalKafkaCluster,
) -> None:
    config = _config(pausable_cluster, retry_bound_s=60.0)
    tid = f"retry-{uuid.uuid4().hex[:8]}"
    fence(config, [tid])  # the transaction coordinator is up before the pause
    pausable_cluster.pause_node(0)
    resume = threading.Timer(3 * config.request_timeout_s, pausable_cluster.resume_node, (0,))
    resume.start()
    try:
        started = time.monotonic()
        fence(config, [tid])  # init_transactions times out at least twice, then succeeds
        assert time.monotonic() - started >= 3 * config.request_timeout_s - 0.5
    finally:
        resume.join()
        pausable_cluster.resume_node(0)


def test_init_transactions_fails_naming_the_call_and_the_wait_beyond_the_bound(
    pausable_cluster: LocalKafkaCluster,
) -> None:
    config = _config(pausable_cluster, retry_bound_s=5.0)
    tid = f"retry-{uuid.uuid4().hex[:8]}"
    fence(config, [tid])
    pausable_cluster.pause_node(0)
    try:
        started = time.monotonic()
        with pytest.raises(TransactionCallTimeoutError) as caught:
            fence(config, [tid])
        waited = time.monotonic() - started
    finally:
        pausable_cluster.resume_node(0)
    message = str(caught.value)
    assert "init_transactions" in message and tid in message, message
    assert "bound 5 s" in message and " s (" in message, message
    # The bound, plus at most one attempt's timeout, plus closing the producer.
    assert 5.0 <= waited < 5.0 + config.request_timeout_s + 5, waited
    fence(config, [tid])  # resumed: the id works again


def test_a_subtask_committer_counts_the_calls_it_made_again(
    pausable_cluster: LocalKafkaCluster,
) -> None:
    """What ``kafka_changelog_task_transaction_retries_total`` counts: a task whose start
    of transactions outlasted a paused broker reports each attempt it made again."""
    config = _config(pausable_cluster, retry_bound_s=60.0)
    tid = f"retry-{uuid.uuid4().hex[:8]}"
    fence(config, [tid])
    quiet = SubtaskCommitter(config, tid)
    try:
        quiet.start()
        assert quiet.retries == 0
    finally:
        quiet.close()
    committer = SubtaskCommitter(config, tid)
    pausable_cluster.pause_node(0)
    resume = threading.Timer(3 * config.request_timeout_s, pausable_cluster.resume_node, (0,))
    resume.start()
    try:
        committer.start()  # init_transactions times out at least twice, then succeeds
        assert committer.retries >= 2, committer.retries
    finally:
        resume.join()
        pausable_cluster.resume_node(0)
        committer.close()
