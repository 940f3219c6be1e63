"""A subtask's part of a checkpoint, committed by the task itself with its outputs.

A streaming task that writes its own outputs commits them, in one Kafka transaction,
together with a :class:`SubtaskCommit`: the subtask's state handle for checkpoint
``checkpoint_id`` and what the task did. The checkpoint itself is complete only when
every subtask of it has committed and the driver has written the checkpoint record;
until then the commits are *pending*. A batch that runs again after a crash (same
application, operator, checkpoint and batch) reuses a pending commit instead of
computing the subtask again, so its outputs are written once.

The commit is a record of the checkpoint topic, keyed per subtask
(:func:`subtask_commit_key`): compaction keeps each subtask's latest commit only,
which is all a re-run needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...serialization import decode, encode
from ..errors import CheckpointFormatError
from .checkpoint import SubtaskState

SUBTASK_COMMIT_SCHEMA = "subtask_commit"
SUBTASK_COMMIT_SCHEMA_HEADER = f"{SUBTASK_COMMIT_SCHEMA}/1"

_SUBTASK_COMMIT_KEY = re.compile(
    r"^(?P<application>.+)/subtask/(?P<operator_id>.+)/(?P<subtask>\d{5})$")


def subtask_commit_key(application: str, operator_id: str, subtask: int) -> str:
    """Record key of a subtask's commits:
    ``{application}/subtask/{operator_id}/{subtask:05d}``."""
    return f"{application}/subtask/{operator_id}/{subtask:05d}"


def parse_subtask_commit_key(key: str) -> tuple[str, str, int] | None:
    """(application, operator id, subtask) of a subtask commit key; None for other keys."""
    match = _SUBTASK_COMMIT_KEY.match(key)
    if match is None:
        return None
    return match["application"], match["operator_id"], int(match["subtask"])


@dataclass(frozen=True)
class SubtaskCommit:
    """One subtask's committed part of checkpoint ``checkpoint_id`` (see the module)."""

    application: str
    operator_id: str
    checkpoint_id: int
    subtask_index: int
    parallelism: int
    #: The micro-batch that computed it, and the Spark query running the batch.
    batch_id: int
    query_id: str
    timestamp_ms: int
    #: Output records committed in the same transaction.
    output_records: int
    #: The subtask's state (``SubtaskState.to_bytes``).
    subtask_state: bytes
    #: What the task did (JSON), reported again when the commit is reused.
    metrics: str

    @property
    def key(self) -> str:
        """This commit's record key."""
        return subtask_commit_key(self.application, self.operator_id, self.subtask_index)

    def state(self) -> SubtaskState:
        """The decoded subtask state."""
        return SubtaskState.from_bytes(self.subtask_state)

    def is_for(self, application: str, operator_id: str, checkpoint_id: int,
               batch_id: int, query_id: str) -> bool:
        """Whether this commit is the result of that batch computing that checkpoint."""
        return (self.application, self.operator_id, self.checkpoint_id, self.batch_id,
                self.query_id) == (application, operator_id, checkpoint_id, batch_id, query_id)

    def to_bytes(self) -> bytes:
        """Serialise (Avro ``schemas/subtask_commit.avsc``)."""
        return encode(SUBTASK_COMMIT_SCHEMA, {
            "application": self.application, "operator_id": self.operator_id,
            "checkpoint_id": self.checkpoint_id, "subtask_index": self.subtask_index,
            "parallelism": self.parallelism, "batch_id": self.batch_id,
            "query_id": self.query_id, "timestamp_ms": self.timestamp_ms,
            "output_records": self.output_records, "subtask_state": self.subtask_state,
            "metrics": self.metrics})

    @staticmethod
    def from_bytes(data: bytes, where: str = "") -> SubtaskCommit:
        """Inverse of :meth:`to_bytes`; :class:`CheckpointFormatError` (naming ``where``)
        on anything else."""
        try:
            record = decode(SUBTASK_COMMIT_SCHEMA, data)
            return SubtaskCommit(**record)
        except Exception as exc:
            at = f" at {where}" if where else ""
            raise CheckpointFormatError(
                f"not a serialised subtask commit{at} ({len(data)} bytes): {exc}") from exc


__all__ = ["SUBTASK_COMMIT_SCHEMA_HEADER", "SubtaskCommit", "parse_subtask_commit_key",
           "subtask_commit_key"]
