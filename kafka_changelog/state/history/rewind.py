"""Rewind: make a retained checkpoint of an application its latest again.

A rewind to checkpoint ``N`` of an application whose latest checkpoint is ``L``:

1. commits a **copy** of ``N`` under the new id ``M = L + 2`` (the same subtask
   handles, log floors, time and Spark properties, plus :data:`REWOUND_FROM_PROPERTY`
   naming ``N``). ``M`` is the latest from the moment its record is durable: the next
   run restores exactly ``N``'s state, and its checkpoints continue at ``M + 1``;
2. tombstones the snapshot chunks only the checkpoints after ``N`` name (no other
   stored checkpoint of any application sharing the checkpoint topic, nor another
   application's subtask commit);
3. discards the checkpoints after ``N`` (``N + 1 .. L``): nothing can resume from
   them any more, and the next changelog garbage collection frees what only they
   referenced.

Why a copy under a new id rather than pointing back at ``N``: checkpoint ids name more
than the checkpoint record. Writers hold changelog records per checkpoint id, host
stores and task-local copies are kept per checkpoint id, and subtask commits of a
batch in the making are matched by it. Ids ``N + 1 .. L`` were used by data that still
exists (a host store at ``L``); ``L + 1`` may have been used by a batch in the making
when the application stopped (a subtask commit, a backend a Python worker keeps at
``L + 1``, matched by id alone). Reusing any of them would let that data pass for the
rewound application's; ``L + 2`` and the ids after it were never used.

Crash safety: the latest is valid after every write (``L`` until ``M`` is durable, ``M``
afterwards). A rewind interrupted after step 1 is finished by running it again: the
latest is then a copy of ``N`` (:data:`REWOUND_FROM_PROPERTY`), and the checkpoints
between ``N`` and it are what is left to discard (steps 2 and 3 repeat safely).

A live driver must not hold the application (:func:`check_not_held`): it would commit
its next batch on top of the rewound state with input it has already read.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..checkpoints.checkpoint import CompletedCheckpoint, SubtaskState
from ..checkpoints.checkpoint_store import RETAIN_ALL, CheckpointStore
from ..checkpoints.driver_claim import DEFAULT_DRIVER_LEASE_S, DriverIdentity, Takeover
from ..checkpoints.source_offsets import SOURCE_OFFSETS_PROPERTY
from ..errors import CheckpointStoreError

#: Property of a rewind's copy: the id of the checkpoint it copies.
REWOUND_FROM_PROPERTY = "rewind.from_checkpoint"
#: Property of a rewind's copy: the latest checkpoint id before the rewind.
REWOUND_LATEST_PROPERTY = "rewind.abandoned_latest"
#: Property of a rewind's copy: when the rewind was made (epoch ms).
REWOUND_AT_PROPERTY = "rewind.at_ms"

#: The copy's id is the latest + this: the latest + 1 may have been used by a batch in
#: the making when the application stopped (see the module docstring).
COPY_ID_GAP = 2

#: A snapshot chunk record: (topic, partition, record key).
Chunk = tuple[str, int, str]


class RewindError(CheckpointStoreError):
    """A rewind that cannot be made (no such retained checkpoint, application held)."""


@dataclass(frozen=True)
class RewindPlan:
    """What rewinding ``application`` to checkpoint ``target_id`` writes.

    Invariant: the checkpoint the application resumes from (``resume_from``) holds
    ``target_id``'s state; ``discard`` are ids above ``target_id`` only.
    """

    application: str
    #: The checkpoint whose state becomes the latest again.
    target_id: int
    #: The latest checkpoint id before this run.
    latest_id: int
    #: The copy to commit (None: nothing to commit, the latest holds the target's state).
    copy: CompletedCheckpoint | None
    #: What the application resumes from: the copy, or the latest as it is.
    resume_from: CompletedCheckpoint
    #: Stored checkpoints to discard, ascending.
    discard: tuple[int, ...]
    #: Snapshot chunks only the discarded checkpoints name.
    chunks: tuple[Chunk, ...]

    @property
    def finishing(self) -> bool:
        """Whether this run finishes an interrupted rewind (the copy is committed)."""
        return self.copy is None and bool(self.discard)

    @property
    def nothing_to_do(self) -> bool:
        """Whether the latest holds the target's state and nothing is left to discard."""
        return self.copy is None and not self.discard

    @property
    def starting_offsets(self) -> str | None:
        """The ``startingOffsets`` JSON of the input the target consumed up to (None:
        the checkpoint records none)."""
        return self.resume_from.properties.get(SOURCE_OFFSETS_PROPERTY)


def plan_rewind(store: CheckpointStore, application: str, to: int,
                now_ms: int | None = None) -> RewindPlan:
    """What rewinding ``application`` to checkpoint ``to`` writes (nothing is written).

    Raises :class:`RewindError` naming the application, ``to`` and the retained ids when
    ``to`` is not retained (never stored, discarded, or beyond retention), or when the
    application has no checkpoint.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    latest = store.latest(application)
    if latest is None:
        known = store.known_applications()
        raise RewindError(
            f"cannot rewind application {application!r}: it has no checkpoint in the "
            f"checkpoint store (applications there: {', '.join(known) or 'none'})")
    ids = store.checkpoint_ids(application)
    rewound_from = latest.properties.get(REWOUND_FROM_PROPERTY)
    # Checkpoints between a rewind's target and its copy are left by an interrupted
    # rewind: they are being discarded (their chunks may be gone already).
    leftover = tuple(i for i in ids if rewound_from is not None
                     and int(rewound_from) < i < latest.checkpoint_id)
    if to == latest.checkpoint_id or (rewound_from is not None and int(rewound_from) == to):
        return RewindPlan(application, to, latest.checkpoint_id, None, latest, leftover,
                          _doomed_chunks(store, application, leftover))
    retained = [i for i in store.retained_ids(application, now) if i not in leftover]
    if to not in retained:
        why = (f"the application was rewound to checkpoint {rewound_from}, and the "
               "checkpoints after it are being discarded" if to in leftover
               else "it is beyond retention and being garbage collected" if to in ids
               else "it was discarded by garbage collection or never existed"
               if to < latest.checkpoint_id else "it is newer than the latest checkpoint")
        raise RewindError(
            f"cannot rewind application {application!r} to checkpoint {to}: {why}; "
            f"retained checkpoints: {', '.join(map(str, retained))} ({_retention(store)})")
    target = store.get(application, to)
    discard = tuple(i for i in ids if i > to)
    copy = dataclasses.replace(
        target, checkpoint_id=latest.checkpoint_id + COPY_ID_GAP,
        properties={**target.properties, REWOUND_FROM_PROPERTY: str(to),
                    REWOUND_LATEST_PROPERTY: str(latest.checkpoint_id),
                    REWOUND_AT_PROPERTY: str(now)})
    return RewindPlan(application, to, latest.checkpoint_id, copy, copy, discard,
                      _doomed_chunks(store, application, discard))


def _retention(store: CheckpointStore) -> str:
    if store.retain >= RETAIN_ALL:
        return "every stored checkpoint counts as retained"
    return f"retain={store.retain}, retain_for_s={store.retain_for_s}"


def check_not_held(store: CheckpointStore, application: str,
                   lease_s: float = DEFAULT_DRIVER_LEASE_S, now_ms: int | None = None,
                   action: str = "rewind") -> None:
    """Raise :class:`RewindError` while a live driver holds ``application`` (a claim not
    released, with a heartbeat younger than ``lease_s``, of a process not known dead);
    the message names ``action``, what cannot be done."""
    claim = store.driver_claim(application)
    # Released: quiet, also when asked from the process that held it (a notebook).
    if claim is None or claim.released:
        return
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if claim.takeover(DriverIdentity.of_this_process(), "", now, lease_s) is Takeover.FREE:
        return
    raise RewindError(
        f"cannot {action} application {application!r}: {claim.describe()} holds it; stop "
        "its streaming query first (its driver releases it at its next heartbeat, within "
        f"a quarter of driver_lease_s; a driver that died stops holding it {lease_s:g} s "
        "after its last heartbeat)")


def execute_rewind(store: CheckpointStore, plan: RewindPlan,
                   delete_chunks: Callable[[Sequence[Chunk]], None]) -> None:
    """Carry out ``plan`` in the crash-safe order of the module docstring: commit the
    copy, tombstone chunks (``delete_chunks``, which must be idempotent), discard.

    Raises :class:`~kafka_changelog.state.errors.CheckpointOrderError` (nothing written)
    when a checkpoint was committed since the plan was made.
    """
    if plan.copy is not None:
        store.commit(plan.copy)
    if plan.chunks:
        delete_chunks(plan.chunks)
    for checkpoint_id in plan.discard:
        store.discard(plan.application, checkpoint_id)


def chunks_of(checkpoints: Iterable[CompletedCheckpoint]) -> set[Chunk]:
    """The snapshot chunk records ``checkpoints`` name."""
    return {chunk for cp in checkpoints for subtask in cp.subtasks
            for chunk in _subtask_chunks(subtask)}


def _subtask_chunks(subtask: SubtaskState) -> Iterable[Chunk]:
    snapshot = subtask.keyed.snapshot if subtask.keyed is not None else None
    if snapshot is None:
        return ()
    return ((snapshot.topic, c.partition, c.record_key(snapshot.backend_id))
            for c in snapshot.chunks)


def _doomed_chunks(store: CheckpointStore, application: str,
                   discard: Sequence[int]) -> tuple[Chunk, ...]:
    """Chunks of the ``discard`` checkpoints that nothing else stored names: no other
    checkpoint of any application, no subtask commit of another application (a
    checkpoint in the making). The application's own subtask commits are of batches
    the rewind abandons."""
    if not discard:
        return ()
    gone = set(discard)
    doomed = chunks_of(store.get(application, i) for i in gone)
    kept = chunks_of(cp for cp in store.all_checkpoints()
                     if cp.application != application or cp.checkpoint_id not in gone)
    for commit in store.all_subtask_commits():
        if commit.application != application:
            kept.update(_subtask_chunks(SubtaskState.from_bytes(commit.subtask_state)))
    return tuple(sorted(doomed - kept))
