"""Changelog handles: what a writer's ``persist`` returns and what restore reads.

A handle names a persisted piece of log (for Kafka: topic-partition offset
ranges) together with the key-group range it covers. Handles are immutable,
can be narrowed to a new key-group range when state is rescaled, and round-trip
through bytes so that checkpoints can store them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from .errors import HandleFormatError
from .keygroups import KeyGroupRange
from .serialization import decode, encode

_MAGIC = "kafka-changelog-handle"
_HANDLE_KINDS: dict[str, type[ChangelogHandle]] = {}


class ChangelogHandle(ABC):
    """A persisted, immutable piece of one writer's log for a key-group range.

    Subclasses set ``kind`` (used when serialising) and ``format_version``, and
    implement the body encoding with their schema ``schemas/<kind>_handle.avsc``.
    """

    kind: ClassVar[str]
    format_version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if isinstance(kind, str):
            _HANDLE_KINDS[kind] = cls

    @property
    @abstractmethod
    def log_id(self) -> str:
        """The writer log this piece belongs to."""

    @property
    @abstractmethod
    def key_group_range(self) -> KeyGroupRange:
        """Key groups whose changes this handle covers."""

    @property
    @abstractmethod
    def checkpoint_id(self) -> int | None:
        """Checkpoint the persist was made for (None if unknown)."""

    @property
    @abstractmethod
    def state_size(self) -> int:
        """Bytes of state-change payload (or of records, for remote storages) covered."""

    @abstractmethod
    def intersection(self, key_group_range: KeyGroupRange) -> ChangelogHandle | None:
        """This handle narrowed to ``key_group_range``; None when nothing overlaps.

        Meta changes belong to every key group, so a narrowed handle keeps them.
        """

    @abstractmethod
    def _to_record(self) -> dict[str, Any]:
        """The body, as a record of ``schemas/<kind>_handle.avsc``."""

    @classmethod
    @abstractmethod
    def _from_record(cls, record: dict[str, Any], format_version: int) -> ChangelogHandle:
        """Inverse of :meth:`_to_record`."""

    def to_bytes(self) -> bytes:
        """Serialise (Avro: an envelope naming the kind, then the body)."""
        body = encode(f"{self.kind}_handle", self._to_record())
        return encode(
            "handle_envelope",
            {"magic": _MAGIC, "format_version": self.format_version, "kind": self.kind,
             "body": body},
        )

    @staticmethod
    def from_bytes(data: bytes) -> ChangelogHandle:
        """Deserialise any kind of handle written by :meth:`to_bytes`."""
        try:
            envelope = decode("handle_envelope", data)
        except Exception as exc:
            raise HandleFormatError(f"not a serialised changelog handle: {exc}") from exc
        if envelope["magic"] != _MAGIC:
            raise HandleFormatError(
                f"not a serialised changelog handle: magic {envelope['magic']!r}, "
                f"expected {_MAGIC!r}"
            )
        kind = envelope["kind"]
        handle_type = _HANDLE_KINDS.get(kind) or _load_kind(kind)
        if handle_type is None:
            raise HandleFormatError(
                f"unknown handle kind {kind!r}; known kinds: {sorted(_HANDLE_KINDS)} "
                "(is the storage package that wrote it imported?)"
            )
        version = envelope["format_version"]
        if version > handle_type.format_version:
            raise HandleFormatError(
                f"{kind} handle format version {version} is newer than this library "
                f"reads (up to {handle_type.format_version})"
            )
        try:
            record = decode(f"{kind}_handle", envelope["body"])
        except Exception as exc:
            raise HandleFormatError(f"corrupt {kind} handle body: {exc}") from exc
        return handle_type._from_record(record, version)


#: The modules of the library's own handle kinds: imported by name when such a handle is
#: read first, without a scan of every installed distribution's entry points (~0.3 s).
_OWN_KINDS = {"kafka": "kafka_changelog.kafka.handle", "memory": "kafka_changelog.memory.handle"}


def _load_kind(kind: str) -> type[ChangelogHandle] | None:
    """Import the module registering ``kind`` (the library's own, else the installed
    storages' entry points) and look ``kind`` up again."""
    import importlib
    from importlib.metadata import entry_points

    own = _OWN_KINDS.get(kind)
    if own is not None:
        importlib.import_module(own)
        return _HANDLE_KINDS.get(kind)

    for entry_point in entry_points(group="kafka_changelog.storages"):
        try:
            entry_point.load()
        except ImportError:
            continue  # a storage whose dependencies are missing cannot have written it
    return _HANDLE_KINDS.get(kind)
