"""Over Kafka, checkpoints restore both ways between the in-memory and the RocksDB table,
at any parallelism: each run restores what the other kind wrote, and both kinds restore
the last checkpoint to the same bytes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog.state.backend.config import StateBackendConfig
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.tables.memory import StateTable
from tests.state.state_helpers import expected_for, ranges, read_user, users_in

from .test_state_kafka import USERS, Job

pytestmark = pytest.mark.broker


@pytest.fixture
def job(kafka_cluster: Any) -> Iterator[Job]:
    job = Job(kafka_cluster)
    yield job
    job.close()


def test_checkpoints_restore_both_ways_between_table_kinds(job: Job, tmp_path: Path) -> None:
    memory = StateBackendConfig("memory")
    rocksdb = StateBackendConfig("rocksdb", str(tmp_path / "rocksdb"))
    model: dict[bytes, Any] = {}
    runs = [(memory, 1, False), (rocksdb, 4, True), (memory, 2, False), (rocksdb, 3, True),
            (rocksdb, 1, False), (memory, 2, True)]
    for checkpoint_id, (kind, parallelism, materialize) in enumerate(runs, start=1):
        job.coordinator.state_backend = kind
        # Job.run checks every restored subtask against the model before changing it.
        job.run(parallelism, checkpoint_id, model, 40, materialize, seed=checkpoint_id)
    latest = job.coordinator.checkpoint()
    for key_groups in ranges(3):
        restored = [job.coordinator.restore_keyed("op", key_groups, latest, job.changelog,
                                                  state_backend=kind)
                    for kind in (memory, rocksdb)]
        assert isinstance(restored[0].table, StateTable)
        assert isinstance(restored[1].table, RocksDBStateTable)
        mine = users_in(USERS, key_groups)
        for backend in restored:
            assert {u: read_user(backend, u) for u in mine} == expected_for(model, mine)
        tables = [b.table for b in restored]
        assert tables[0].key_groups() == tables[1].key_groups() != []
        for key_group in tables[0].key_groups():
            assert tables[0].serialize_group(key_group) == tables[1].serialize_group(key_group)
        assert tables[0].entry_count() == tables[1].entry_count()
        for backend in restored:
            backend.close()
    assert list((tmp_path / "rocksdb").iterdir()) == []  # working copies deleted at close
