"""What garbage collection of a changelog is told to keep, and what it reports.

A *log floor* is the lowest offset of a topic partition an application may still
reference in a later checkpoint; handles name what retained checkpoints read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .handle import ChangelogHandle


@dataclass(frozen=True, order=True)
class LogFloor:
    """An application may still reference ``topic[partition]`` at or above ``offset``.

    Read when a checkpoint is committed: everything the application writes after
    that commit (until its next one) lies at or above it, so garbage collection by
    any application sharing the topic keeps it.
    """

    topic: str
    partition: int
    offset: int


#: What must stay: the handles retained checkpoints read, and every application's floors.
StillNeeded = tuple[Iterable[ChangelogHandle], Iterable[LogFloor]]


@dataclass(frozen=True)
class GarbageCollectionResult:
    """Per partition of ``topic``: the log start offset after collecting."""

    topic: str
    deleted_below: dict[int, int]
