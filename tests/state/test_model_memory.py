"""The model-based checkpoint/restore test against the in-memory storage."""

from __future__ import annotations

from typing import ClassVar

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kafka_changelog import InMemoryChangelogStorage
from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

from .model_machine import CheckpointMachine, Environment, FailingSnapshots, fresh_totals


def memory_environment() -> Environment:
    snapshots = FailingSnapshots(InMemorySnapshotStore())
    storage = InMemoryChangelogStorage()
    coordinator = CheckpointCoordinator(
        "model-app", InMemoryCheckpointStore(retain=2), snapshots,  # type: ignore[arg-type]
        storage)
    return Environment(coordinator, snapshots, storage.close)


class MemoryMachine(CheckpointMachine):
    totals: ClassVar[dict[str, int]] = fresh_totals()
    make_environment = staticmethod(memory_environment)


#: Enough steps that restores, garbage collection and materializations all happen.
SETTINGS = settings(
    max_examples=60, stateful_step_count=50, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])


def test_the_machine_keeps_the_model_through_restores_gc_and_materialization() -> None:
    """The machine's runs keep state equal to the model (its invariants), and they did
    exercise restores, garbage collection and materialization (counted on this run)."""
    MemoryMachine.totals = fresh_totals()
    run_state_machine_as_test(MemoryMachine, settings=SETTINGS)
    totals = MemoryMachine.totals
    assert totals["restores"] > 0, totals
    assert totals["discarded"] > 0, totals
    assert totals["deleted_chunks"] > 0, totals
    assert totals["materializations"] > 0, totals
