"""A model-based test of checkpoints, materialization, crashes and rescaling.

Random state operations over many keys run on real backends and on a plain-dict
model. Checkpoints complete or abort, materializations run (some fail), and the
job crashes (writers dropped without close) and restarts at a random parallelism
from the latest completed checkpoint. After every restore the state must equal
the model at that checkpoint, exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kafka_changelog import key_group_for_key
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.checkpoints.checkpoint import SubtaskState
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from kafka_changelog.state.snapshots.snapshot_store import SnapshotStore

from .state_helpers import MAX_P, apply_event, expected_for, model_apply, ranges, read_user

USERS = [f"user-{i:03d}".encode() for i in range(40)]
PAGES = ["home", "cart", "search", "item"]
OPERATOR = "sessions"


class FailingSnapshots:
    """Wraps a snapshot store; ``fail_next`` makes the next write fail."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store
        self.fail_next = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def write(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail_next:
            self.fail_next = False
            raise OSError("injected snapshot failure")
        return self.store.write(*args, **kwargs)

    def begin_write(self, *args: Any, **kwargs: Any) -> Any:
        """How a backend materializes (key group by key group)."""
        if self.fail_next:
            self.fail_next = False
            raise OSError("injected snapshot failure")
        return self.store.begin_write(*args, **kwargs)


@dataclass
class Environment:
    """What a machine runs against (memory or Kafka), built fresh per example."""

    coordinator: CheckpointCoordinator
    snapshots: FailingSnapshots
    close: Callable[[], None]


def fresh_totals() -> dict[str, int]:
    """Counters a machine class adds its examples' work to."""
    return {"restores": 0, "discarded": 0, "deleted_chunks": 0, "materializations": 0}


class CheckpointMachine(RuleBasedStateMachine):
    """Subclasses set ``make_environment``."""

    make_environment: Callable[[], Environment]
    #: Totals over all examples of a run, so a test can check the machine did real work.
    totals: ClassVar[dict[str, int]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.env = type(self).make_environment()
        self.model: dict[bytes, Any] = {}
        self.committed: dict[bytes, Any] = {}
        self.parallelism = 1
        self.backends: list[ChangelogKeyedStateBackend] = []
        self.next_checkpoint = 1
        self.restores = 0

    def _start(self, parallelism: int) -> None:
        coordinator = self.env.coordinator
        checkpoint = coordinator.checkpoint()
        self.parallelism = parallelism
        self.backends = [
            coordinator.restore_keyed(
                OPERATOR, r, checkpoint,
                materialization=MaterializationConfig(None, 0, max_failures_allowed=5))
            for r in ranges(parallelism)
        ]
        for backend in self.backends:
            backend._store = self.env.snapshots  # type: ignore[assignment]  # failure injection

    @initialize(parallelism=st.integers(1, 4))
    def start(self, parallelism: int) -> None:
        self._start(parallelism)

    def _backend_of(self, user: bytes) -> ChangelogKeyedStateBackend:
        key_group = key_group_for_key(user, MAX_P)
        return self.backends[key_group * self.parallelism // MAX_P]

    @rule(user=st.sampled_from(USERS), page=st.sampled_from(PAGES),
          amount=st.sampled_from([0, 3, 13, 40]), repeat=st.integers(1, 8))
    def events(self, user: bytes, page: str, amount: int, repeat: int) -> None:
        for _ in range(repeat):
            apply_event(self._backend_of(user), user, page, amount)
            model_apply(self.model, user, page, amount)

    @rule()
    def checkpoint(self) -> None:
        checkpoint_id = self.next_checkpoint
        self.next_checkpoint += 1
        handles = [b.snapshot(checkpoint_id).result(60) for b in self.backends]
        coordinator = self.env.coordinator
        before = coordinator.last_garbage
        coordinator.complete(checkpoint_id, [
            SubtaskState(OPERATOR, i, self.parallelism, h, None) for i, h in enumerate(handles)])
        if coordinator.last_garbage is not before:
            type(self).totals["discarded"] += len(coordinator.last_garbage.discarded_checkpoints)
            type(self).totals["deleted_chunks"] += coordinator.last_garbage.deleted_chunks
        for backend in self.backends:
            backend.notify_checkpoint_complete(checkpoint_id)
        self.committed = copy.deepcopy(self.model)

    @rule()
    def materialize_all_then_checkpoint(self) -> None:
        # A checkpoint whose every subtask has a fresh snapshot: once subsumed, its
        # chunks are garbage for the coordinator (unlike those of materializations no
        # checkpoint saw, which the backend drops itself).
        for backend in self.backends:
            backend.materialize_now()
        self.checkpoint()

    @rule()
    def aborted_checkpoint(self) -> None:
        checkpoint_id = self.next_checkpoint
        self.next_checkpoint += 1
        for backend in self.backends:
            backend.snapshot(checkpoint_id).result(60)
            backend.notify_checkpoint_aborted(checkpoint_id)

    @rule(index=st.integers(0, 3), fail=st.booleans())
    def materialize(self, index: int, fail: bool) -> None:
        backend = self.backends[index % len(self.backends)]
        self.env.snapshots.fail_next = fail
        future = backend.materialize()
        if future is not None:
            future.exception(60)
            backend.poll_materialization()
        self.env.snapshots.fail_next = False

    @precondition(lambda self: self.next_checkpoint > 1)
    @rule(parallelism=st.integers(1, 5))
    def crash_and_restart(self, parallelism: int) -> None:
        # A crash: the backends (and their writers) are dropped without close.
        self.backends = []
        self.model = copy.deepcopy(self.committed)
        self._start(parallelism)
        self.restores += 1
        for backend, key_groups in zip(self.backends, ranges(parallelism), strict=True):
            mine = [u for u in USERS if key_groups.contains(key_group_for_key(u, MAX_P))]
            assert {u: read_user(backend, u) for u in mine} == expected_for(self.model, mine)

    @invariant()
    def live_state_matches_the_model(self) -> None:
        for user in USERS[:5]:
            assert read_user(self._backend_of(user), user) == expected_for(self.model, [user])[
                user]

    def teardown(self) -> None:
        totals = type(self).totals
        totals["restores"] += self.restores
        totals["materializations"] += sum(
            b.materialization_stats.completed for b in self.backends)
        for backend in self.backends:
            backend.close()
        self.env.close()
