"""The Kafka snapshot and checkpoint stores' tests, unchanged, against a container broker.

The tests of ``tests/kafka/test_snapshot_store.py`` and ``test_checkpoint_store.py`` take
their broker from a module fixture named ``cluster``; here it is the container broker.
"""

from __future__ import annotations

import pytest

from kafka_changelog.testing.container import ContainerKafkaCluster
from tests.kafka.test_checkpoint_store import (
    config,
    test_a_corrupt_record_is_named,
    test_commit_latest_get_retention_discard_survive_a_fresh_store,
    test_instances_see_each_others_commits,
    test_refuses_a_non_increasing_id,
    test_view_survives_compaction,
)
from tests.kafka.test_snapshot_store import (
    store,
    test_chunk_below_the_log_start_is_missing,
    test_concurrent_writers_share_a_store,
    test_errors_name_the_missing_or_corrupt_chunk,
    test_old_handles_stay_exact_through_newer_materializations_and_compaction,
    test_write_read_exact_multi_chunk_and_empty_groups,
)

pytestmark = [pytest.mark.broker, pytest.mark.container]

__all__ = [
    "config",
    "store",
    "test_a_corrupt_record_is_named",
    "test_chunk_below_the_log_start_is_missing",
    "test_commit_latest_get_retention_discard_survive_a_fresh_store",
    "test_concurrent_writers_share_a_store",
    "test_errors_name_the_missing_or_corrupt_chunk",
    "test_instances_see_each_others_commits",
    "test_old_handles_stay_exact_through_newer_materializations_and_compaction",
    "test_refuses_a_non_increasing_id",
    "test_view_survives_compaction",
    "test_write_read_exact_multi_chunk_and_empty_groups",
]


@pytest.fixture
def cluster(shared_container_cluster: ContainerKafkaCluster) -> ContainerKafkaCluster:
    """The broker the imported tests and fixtures use: the shared container broker."""
    return shared_container_cluster
