"""Materialization without keys, on Kafka: the changelog and snapshot topics are real."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.kafka.test_state_kafka import Job
from tests.state.test_materialize_without_keys import checkpoints_without_keys

pytestmark = pytest.mark.broker


@pytest.fixture
def job(kafka_cluster: Any) -> Iterator[Job]:
    job = Job(kafka_cluster)
    yield job
    job.close()


def test_a_subtask_without_keys_still_materializes_on_kafka(job: Job) -> None:
    checkpoints_without_keys(job.storage, job.snapshots)
