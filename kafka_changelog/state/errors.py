"""Errors of snapshot chunks and of the checkpoint metadata store.

Each error names where the data should have been (topic, partition, offset), what
it belongs to (backend id, key group, materialization id, chunk number) and what
was found instead, so that a log line alone is enough to act on.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ChangelogError


def _chunk_location(
    topic: str,
    partition: int,
    offset: int,
    backend_id: str,
    key_group: int,
    materialization_id: int,
    chunk_no: int,
) -> str:
    return (
        f"chunk {chunk_no} of key group {key_group} (backend {backend_id}, materialization "
        f"{materialization_id}) at {topic}[{partition}]@{offset}"
    )


class SnapshotMissingError(ChangelogError, LookupError):
    """A snapshot chunk a handle refers to is gone (deleted, compacted, or never written).

    ``found`` says what is at the chunk's position instead: nothing (the offset is
    below the log start or was removed by compaction), another record, or a tombstone.
    """

    def __init__(
        self,
        *,
        topic: str,
        partition: int,
        offset: int,
        backend_id: str,
        key_group: int,
        materialization_id: int,
        chunk_no: int,
        found: str,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.backend_id = backend_id
        self.key_group = key_group
        self.materialization_id = materialization_id
        self.chunk_no = chunk_no
        self.found = found
        where = _chunk_location(
            topic, partition, offset, backend_id, key_group, materialization_id, chunk_no)
        super().__init__(
            f"snapshot {where} is missing: found {found}. The chunk was deleted (its "
            "snapshot was discarded) or the topic lost data; the snapshot cannot be restored"
        )


class SnapshotCorruptError(ChangelogError, ValueError):
    """A snapshot chunk is there but its content is wrong (checksum, size or fields)."""

    def __init__(
        self,
        *,
        topic: str,
        partition: int,
        offset: int,
        backend_id: str,
        key_group: int,
        materialization_id: int,
        chunk_no: int,
        what: str,
        expected: object,
        found: object,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.backend_id = backend_id
        self.key_group = key_group
        self.materialization_id = materialization_id
        self.chunk_no = chunk_no
        self.what = what
        self.expected = expected
        self.found = found
        where = _chunk_location(
            topic, partition, offset, backend_id, key_group, materialization_id, chunk_no)
        super().__init__(
            f"snapshot {where} is corrupt: {what} expected {expected}, found {found}"
        )


class SnapshotWriteError(ChangelogError):
    """A snapshot chunk (or a tombstone) was not acknowledged by the broker."""


class CheckpointStoreError(ChangelogError):
    """The checkpoint metadata store cannot do what was asked."""


class CheckpointNotFoundError(CheckpointStoreError, LookupError):
    """A checkpoint id is not (or no longer) stored for an application."""

    def __init__(self, application: str, checkpoint_id: int, retained: Iterable[int]) -> None:
        self.application = application
        self.checkpoint_id = checkpoint_id
        self.retained = sorted(retained)
        ids = ", ".join(str(i) for i in self.retained) or "none"
        super().__init__(
            f"application {application!r} has no checkpoint {checkpoint_id}; "
            f"stored checkpoints: {ids}"
        )


class CheckpointOrderError(CheckpointStoreError, ValueError):
    """A checkpoint was committed with an id not greater than the latest one."""

    def __init__(self, application: str, checkpoint_id: int, latest_id: int) -> None:
        self.application = application
        self.checkpoint_id = checkpoint_id
        self.latest_id = latest_id
        super().__init__(
            f"cannot commit checkpoint {checkpoint_id} of application {application!r}: "
            f"expected an id greater than the latest committed checkpoint {latest_id}"
        )


class CheckpointFormatError(CheckpointStoreError, ValueError):
    """Serialised checkpoint bytes (or a checkpoint-topic record) could not be decoded."""


class StateMismatchError(ChangelogError, ValueError):
    """A state was registered (or restored) with another kind or serializer."""


class StateSchemaError(StateMismatchError):
    """A state's new declaration cannot read what its old ones wrote: another kind, a
    serializer of another type, or an Avro schema change without a resolution. The
    message names the state and every incompatibility."""


class MaxParallelismMismatchError(ChangelogError, ValueError):
    """A checkpoint is restored with another max parallelism than it was written with
    (keys would hash to other key groups and miss their state)."""


class NoCurrentKeyError(ChangelogError, RuntimeError):
    """Keyed state was used before ``set_current_key``."""


class MaterializationFailedError(ChangelogError):
    """Materialization failed more often in a row than allowed."""


class StateBackendUnavailableError(ChangelogError, ImportError):
    """A state backend needs a package that is not installed (named in the message)."""


class LocalStateError(ChangelogError):
    """A host-local state store cannot be used (locked too long, unreadable manifest)."""


class KeyNotInBatchError(ChangelogError, LookupError):
    """Bulk state was asked for a key that is not one of the keys it was opened for."""

    def __init__(self, key: object, batch_keys: int, examples: Iterable[object]) -> None:
        self.key = key
        shown = ", ".join(repr(k) for k in examples)
        super().__init__(
            f"key {key!r} is not one of the {batch_keys} keys this bulk state was opened for "
            f"(e.g. {shown}): bulk state reads and writes only the keys of its batch")
