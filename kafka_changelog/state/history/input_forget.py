"""Forget the input offsets a checkpoint recorded for topics deleted and created again.

A topic created again starts its offsets at 0: the offsets the state recorded for it
(:mod:`kafka_changelog.state.checkpoints.input_progress`) no longer name its records,
and every batch reading it is refused as a re-read. Forgetting them commits a **copy**
of the latest checkpoint without those topics' offsets, under a new id (the latest +
:data:`~kafka_changelog.state.history.rewind.COPY_ID_GAP`, for the reasons a rewind's
copy takes one), recording which topics were forgotten. The state is the latest's, unchanged; the
next batch reads the topics as new input. One commit: the latest is valid before and
after it. A live driver must not hold the application (it would commit on top of the
copy with its own idea of the offsets).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..checkpoints.checkpoint import CompletedCheckpoint
from ..checkpoints.checkpoint_store import CheckpointStore
from ..checkpoints.input_progress import InputProgress
from .rewind import COPY_ID_GAP, RewindError

#: Property of the copy: the topics whose offsets it forgot (a JSON list).
FORGOT_TOPICS_PROPERTY = "input.forgot_topics"
#: Property of the copy: the id of the checkpoint it copies.
FORGOT_FROM_PROPERTY = "input.forgot_from_checkpoint"


@dataclass(frozen=True)
class ForgetPlan:
    """What forgetting ``topics`` of ``application``'s latest checkpoint commits."""

    application: str
    latest: CompletedCheckpoint
    #: The topics to forget, sorted (each recorded by the latest checkpoint).
    topics: tuple[str, ...]
    #: The copy to commit.
    copy: CompletedCheckpoint


def plan_forget(store: CheckpointStore, application: str, topics: Sequence[str],
                now_ms: int | None = None) -> ForgetPlan:
    """The copy forgetting ``topics`` (nothing written). Raises :class:`RewindError`
    naming the application when it has no checkpoint, and the topics it records when
    one of ``topics`` is not among them."""
    latest = store.latest(application)
    if latest is None:
        raise RewindError(f"application {application!r} has no checkpoint in the "
                          "checkpoint store: no input offsets to forget")
    where = f"checkpoint {latest.checkpoint_id} of application {application!r}"
    progress = InputProgress.of(latest.properties, where)
    unknown = sorted(set(topics) - set(progress.offsets))
    if unknown or not topics:
        raise RewindError(
            f"{where} records no input offsets of topic(s) {unknown or list(topics)}; it "
            f"records those of: {', '.join(sorted(progress.offsets)) or 'no topic'}")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    kept = progress.without_topics(topics)
    properties = {k: v for k, v in latest.properties.items()
                  if k not in progress.properties()}
    copy = dataclasses.replace(
        latest, checkpoint_id=latest.checkpoint_id + COPY_ID_GAP, timestamp_ms=now,
        properties={**properties, **kept.properties(),
                    FORGOT_TOPICS_PROPERTY: json.dumps(sorted(set(topics))),
                    FORGOT_FROM_PROPERTY: str(latest.checkpoint_id)})
    return ForgetPlan(application, latest, tuple(sorted(set(topics))), copy)


def execute_forget(store: CheckpointStore, plan: ForgetPlan) -> None:
    """Commit the copy (raises ``CheckpointOrderError``, nothing written, when a
    checkpoint was committed since the plan was made)."""
    store.commit(plan.copy)


__all__ = ["FORGOT_FROM_PROPERTY", "FORGOT_TOPICS_PROPERTY", "ForgetPlan", "execute_forget",
           "plan_forget"]
