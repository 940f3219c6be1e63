"""Task-local recovery: valid local copies are used first; bad ones never win."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from kafka_changelog import KeyGroupRange
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.local_recovery import LocalRecoveryStore
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint, SubtaskState
from kafka_changelog.state.errors import SnapshotMissingError
from tests.kafka.test_state_kafka import USERS, Job
from tests.state.state_helpers import MAX_P, apply_event, expected_for, model_apply, read_user

pytestmark = pytest.mark.broker

ALL = KeyGroupRange.of(0, MAX_P - 1)


@pytest.fixture
def job(kafka_cluster: Any) -> Iterator[Job]:
    job = Job(kafka_cluster)
    yield job
    job.close()


def checkpointed(
    job: Job, local: LocalRecoveryStore
) -> tuple[CompletedCheckpoint, dict[bytes, Any]]:
    """State with a snapshot and a changelog tail since it, checkpointed with local copies."""
    model: dict[bytes, Any] = {}
    rng = random.Random(5)
    backend = ChangelogKeyedStateBackend(job.storage, job.snapshots, "op", ALL, MAX_P,
                                         local_recovery=local)
    for round_ in range(2):
        for _ in range(150):
            user, page, amount = rng.choice(USERS), rng.choice(["a", "b"]), rng.choice([1, 13])
            apply_event(backend, user, page, amount)
            model_apply(model, user, page, amount)
        if round_ == 0:
            backend.materialize_now()
    handle = backend.snapshot(1).result(60)
    checkpoint = job.coordinator.complete(1, [SubtaskState("op", 0, 1, handle, None)])
    backend.close()
    return checkpoint, model


def restore(job: Job, checkpoint: CompletedCheckpoint, local: LocalRecoveryStore | None
            ) -> dict[bytes, Any]:
    backend = job.coordinator.restore_keyed("op", ALL, checkpoint, job.changelog,
                                            local_recovery=local)
    state = {u: read_user(backend, u) for u in USERS}
    backend.close()
    return state


def delete_all_kafka_data(job: Job, checkpoint: CompletedCheckpoint) -> None:
    keyed = checkpoint.subtasks[0].keyed
    assert keyed is not None and keyed.snapshot is not None
    doomed = [TopicPartition(job.changelog.topic, p, -1) for p in range(4)]
    doomed += [TopicPartition(keyed.snapshot.topic, p, -1) for p in range(4)]
    for future in job.admin.delete_records(doomed).values():
        future.result(30)


def test_valid_local_copies_are_used_first(job: Job, tmp_path: Path) -> None:
    local = LocalRecoveryStore(tmp_path / "task-0")
    checkpoint, model = checkpointed(job, local)
    # Kafka loses everything: only the local copies can give the state back.
    delete_all_kafka_data(job, checkpoint)
    reader = LocalRecoveryStore(tmp_path / "task-0")
    assert restore(job, checkpoint, reader) == expected_for(model, USERS)
    assert reader.stats.hits > 0 and reader.stats.rejected == 0 and reader.stats.misses == 0


def test_corrupt_local_copies_fall_back_to_kafka(job: Job, tmp_path: Path) -> None:
    local = LocalRecoveryStore(tmp_path / "task-0")
    checkpoint, model = checkpointed(job, local)
    files = sorted((tmp_path / "task-0").rglob("*.bin"))
    assert len(files) > 2
    for path in files:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    reader = LocalRecoveryStore(tmp_path / "task-0")
    assert restore(job, checkpoint, reader) == expected_for(model, USERS)
    assert reader.stats.rejected == len(files) and reader.stats.hits == 0


def test_stale_local_copies_never_win(job: Job, tmp_path: Path) -> None:
    local = LocalRecoveryStore(tmp_path / "task-0")
    checkpoint, model = checkpointed(job, local)
    # Swap every changelog copy's content with another one's: right place, wrong content.
    copies = sorted((tmp_path / "task-0" / "changelog").glob("*.bin"))
    assert copies
    contents = [p.read_bytes() for p in copies]
    for path, content in zip(copies, contents[1:] + contents[:1], strict=True):
        path.write_bytes(content if len(copies) > 1 else content + b"x")
    for path in (tmp_path / "task-0" / "snapshots").glob("*.bin"):
        path.write_bytes(path.read_bytes()[:-1])  # a copy of another size
    reader = LocalRecoveryStore(tmp_path / "task-0")
    assert restore(job, checkpoint, reader) == expected_for(model, USERS)
    assert reader.stats.hits == 0 and reader.stats.rejected > 0


def test_without_local_copies_deleted_kafka_data_is_an_error(job: Job, tmp_path: Path) -> None:
    checkpoint, _ = checkpointed(job, LocalRecoveryStore(tmp_path / "task-0"))
    delete_all_kafka_data(job, checkpoint)
    with pytest.raises(SnapshotMissingError):
        restore(job, checkpoint, LocalRecoveryStore(tmp_path / "elsewhere"))
