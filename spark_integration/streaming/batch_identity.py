"""Which checkpoint a micro-batch commits, and which one its state starts from.

Checkpoint ids are the application's own: each commit takes the latest id + 1.
Every checkpoint records the Spark query that committed it (``spark.query_id``,
the id Spark keeps in the query's ``checkpointLocation``) and its batch id. A batch
is then one of:

* **new** — the same query's next batch: state starts from the latest checkpoint,
  the batch commits latest + 1;
* **re-run** — the same query's batch that committed the latest checkpoint, run again
  by Spark after a crash between our commit and Spark's: state starts from the
  checkpoint before it, nothing is committed again (outputs were committed with it);
* **new query** — a query with another id (a fresh or cleared ``checkpointLocation``,
  a redeployed job), or any query after a state write made the application's first
  checkpoint (a bootstrap, which no query committed): the application's state carries
  over: state starts from the latest checkpoint and the batch commits latest + 1,
  whatever its batch id;
* **rolled back** — the same query at a batch *before* the one that committed the
  latest checkpoint (its ``checkpointLocation`` was restored from an older copy):
  refused with :class:`BatchOrderError`, since its input was already applied;
* **after a rewind** — the same query as the latest checkpoint when that checkpoint is
  a rewind's copy (``kafka-changelog rewind``): refused with :class:`BatchOrderError`,
  since the query's ``checkpointLocation`` goes on after the input of the abandoned
  checkpoints; a new query (a new ``checkpointLocation`` reading from the offsets the
  rewound checkpoint recorded) is a *new query* as above.

An application holds the state of one stateful operator (one processor commits its
checkpoints): a batch of operator B in an application whose checkpoints hold operator A
is refused with :class:`OperatorMismatchError` before anything runs. Without it, B would
take A's commit of the same batch for its own (a "re-run": B's state would never move),
or start from A's checkpoint, which has no state of B, and its commit would drop A's.

Each checkpoint records the Spark types of its key columns (``spark.key_types``); a batch
whose key columns have types that encode keys otherwise (a ``string`` where a ``bigint``
was; ``int`` for ``bigint`` is fine) is refused with
:class:`~kafka_changelog.keys.KeyTypeError`, since its keys would not find their state.

Checkpoints written by kafka-changelog 0.1 carry no query id; there checkpoint id
was batch id + 1, which is how such a latest checkpoint is matched.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

from kafka_changelog.enums import StrEnum
from kafka_changelog.errors import ChangelogError
from kafka_changelog.keys import (
    KEY_TYPES_PROPERTY,
    KeyTypeError,
    recorded_key_types,
    same_key_encoding,
)
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.checkpoints.checkpoint_store import CheckpointStore
from kafka_changelog.state.checkpoints.source_offsets import SOURCE_OFFSETS_PROPERTY
from kafka_changelog.state.history.rewind import REWOUND_FROM_PROPERTY
from kafka_changelog.state.history.state_write import STATE_WRITE_MODE_PROPERTY

from ..checkpoint_properties import BATCH_ID, QUERY_ID


class BatchOrderError(ChangelogError):
    """A query runs a batch its application's checkpoints show was already applied."""


class OperatorMismatchError(ChangelogError):
    """An application's checkpoints hold the state of operators other than the one
    committing (each stateful operator needs an application of its own)."""


class BatchKind(StrEnum):
    """What a micro-batch is to the application's checkpoints (a ``str``: reports carry
    the value)."""

    #: The application's first batch: no checkpoint yet.
    FIRST = "first"
    #: The batch after the latest checkpoint's, of the same query.
    NEW = "new"
    #: A batch whose checkpoint is committed already, run again by Spark: nothing is
    #: committed.
    RERUN = "rerun"
    #: A batch of another query than the latest checkpoint's (a new checkpointLocation):
    #: the state carries over.
    NEW_QUERY = "new-query"


@dataclass(frozen=True)
class BatchPlan:
    """What a micro-batch does with the application's checkpoints."""

    #: The checkpoint the batch commits (for a re-run: the one it committed before).
    checkpoint_id: int
    #: The checkpoint its state starts from (None: empty state).
    base: int | None
    #: False for a re-run of a committed batch: nothing is committed.
    commit: bool
    kind: BatchKind
    #: The Spark types of the batch's key columns (recorded with the checkpoint).
    key_types: tuple[str, ...] = ()

    def properties(self, query_id: str, batch_id: int) -> dict[str, str]:
        """What the committed checkpoint records about the batch (and its key types)."""
        recorded = {QUERY_ID: query_id, BATCH_ID: str(batch_id)}
        if self.key_types:
            recorded[KEY_TYPES_PROPERTY] = json.dumps(list(self.key_types))
        return recorded


def plan_batch(store: CheckpointStore, application: str, query_id: str,
               batch_id: int, operator_id: str | None = None,
               key_types: Sequence[str] = ()) -> BatchPlan:
    """The plan of batch ``batch_id`` of query ``query_id`` (see the module docstring).

    With ``operator_id``, the application's latest checkpoint must hold that operator's
    state and no other's (:class:`OperatorMismatchError` otherwise); with ``key_types``
    (the Spark types of the key columns, recorded with the checkpoint the plan commits),
    its key columns must have had these types (:class:`KeyTypeError` otherwise).
    """
    latest = store.latest(application)
    if latest is not None:
        if operator_id is not None:
            check_operator(latest, operator_id)
        if key_types:
            check_key_types(latest, key_types)
    plan = _plan(store, application, query_id, batch_id, latest)
    return dataclasses.replace(plan, key_types=tuple(key_types)) if key_types else plan


def _plan(store: CheckpointStore, application: str, query_id: str, batch_id: int,
          latest: CompletedCheckpoint | None) -> BatchPlan:
    if latest is None:
        return BatchPlan(1, None, True, BatchKind.FIRST)
    recorded_query = latest.properties.get(QUERY_ID)
    if recorded_query is None:
        if STATE_WRITE_MODE_PROPERTY in latest.properties:
            # A state write's first checkpoint of the application (a bootstrap): no
            # query committed it, every query's batch is a new query's.
            return BatchPlan(latest.checkpoint_id + 1, latest.checkpoint_id, True,
                             BatchKind.NEW_QUERY)
        return _plan_after_legacy(store, application, latest, batch_id)
    if recorded_query != query_id:
        return BatchPlan(latest.checkpoint_id + 1, latest.checkpoint_id, True, BatchKind.NEW_QUERY)
    recorded_batch = int(latest.properties.get(BATCH_ID, "-1"))
    rewound_from = latest.properties.get(REWOUND_FROM_PROPERTY)
    if rewound_from is not None:
        raise BatchOrderError(
            f"application {application!r} was rewound to checkpoint {rewound_from} (now "
            f"checkpoint {latest.checkpoint_id}), but Spark query {query_id} runs batch "
            f"{batch_id} from the checkpointLocation that committed it (batch "
            f"{recorded_batch}): that checkpointLocation goes on after input the rewind "
            "took back, which would be skipped. Start the query with a new "
            "checkpointLocation and startingOffsets="
            f"{latest.properties.get(SOURCE_OFFSETS_PROPERTY, '(not recorded)')} "
            "(spark_integration.starting_offsets gives it)")
    if batch_id > recorded_batch:
        return BatchPlan(latest.checkpoint_id + 1, latest.checkpoint_id, True, BatchKind.NEW)
    if batch_id == recorded_batch:
        return BatchPlan(latest.checkpoint_id, _before(store, application, latest), False,
                         BatchKind.RERUN)
    raise BatchOrderError(
        f"application {application!r}: Spark query {query_id} runs batch {batch_id}, but "
        f"the application's latest checkpoint {latest.checkpoint_id} was committed by "
        f"batch {recorded_batch} of the same query: its checkpointLocation was rolled back "
        "to an older copy, and replaying batches already applied would count their input "
        "twice. Restore the newest checkpointLocation, or start the query with a fresh "
        "checkpointLocation (the state then continues from checkpoint "
        f"{latest.checkpoint_id})."
    )


def check_operator(latest: CompletedCheckpoint, operator_id: str) -> None:
    """Refuse ``operator_id`` unless it is the only operator of ``latest``."""
    found = latest.operators()
    if not found or found == [operator_id]:
        return
    others = [o for o in found if o != operator_id]
    application = latest.application
    if operator_id in found:
        raise OperatorMismatchError(
            f"application {application!r}: checkpoint {latest.checkpoint_id} holds the state "
            f"of operators {found}; a streaming processor commits one operator's state, so "
            f"its commit would drop that of {others}. Give operator {operator_id!r} an "
            "application of its own.")
    raise OperatorMismatchError(
        f"application {application!r}: checkpoint {latest.checkpoint_id} holds the state of "
        f"operator(s) {others}, not of operator {operator_id!r}; an application keeps one "
        f"stateful operator's state. Give operator {operator_id!r} an application of its "
        f"own (e.g. application={application + '-' + operator_id!r}), or set "
        f"operator_id={others[0]!r} to continue that operator's state.")


def check_key_types(latest: CompletedCheckpoint, key_types: Sequence[str]) -> None:
    """Refuse key columns whose types encode keys otherwise than the types ``latest``
    recorded (if it did): a key's bytes, so its state, depend on its type (a ``date``
    is not a ``timestamp``; every integral type is alike, see
    :func:`kafka_changelog.keys.key_encoding`)."""
    expected = recorded_key_types(latest.properties)
    if expected is None:
        return  # written before key types were recorded
    if not same_key_encoding(expected, key_types):
        raise KeyTypeError(
            f"application {latest.application!r}: the key column(s) are of type(s) "
            f"{list(key_types)}, but checkpoint {latest.checkpoint_id} was written with "
            f"{expected}: keys of another type have other bytes and would not find their "
            "state. Cast the key column(s) to the recorded type(s), or start a new "
            "application.")


def _plan_after_legacy(store: CheckpointStore, application: str,
                       latest: CompletedCheckpoint, batch_id: int) -> BatchPlan:
    # Written by 0.1, where checkpoint id = batch id + 1.
    if batch_id + 1 == latest.checkpoint_id:
        return BatchPlan(latest.checkpoint_id, _before(store, application, latest), False,
                         BatchKind.RERUN)
    kind = BatchKind.NEW if batch_id + 1 > latest.checkpoint_id else BatchKind.NEW_QUERY
    return BatchPlan(latest.checkpoint_id + 1, latest.checkpoint_id, True, kind)


def _before(store: CheckpointStore, application: str, checkpoint: CompletedCheckpoint
            ) -> int | None:
    """The checkpoint committed just before ``checkpoint`` (None: it was the first)."""
    older = [i for i in store.checkpoint_ids(application) if i < checkpoint.checkpoint_id]
    if older:
        return older[-1]
    if checkpoint.checkpoint_id > 1:  # ids start at 1, and retention keeps at least two
        raise BatchOrderError(
            f"application {application!r}: Spark runs again the batch that committed "
            f"checkpoint {checkpoint.checkpoint_id}, but the checkpoint before it is no longer "
            "stored, so the batch cannot be recomputed; was the checkpoint topic edited?")
    return None
