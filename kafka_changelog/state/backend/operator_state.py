"""Operator (non-keyed) state that rescales: list state and union-list state.

After the rescalable non-partitioned state FLIP: a subtask exposes its state as a
list of independent elements. On restore at another parallelism, list state is
redistributed (all elements, in subtask order, split into contiguous even parts),
and union-list state gives every subtask the union of all elements (each picks
what it needs). Operator state is small and snapshotted whole at each checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from ..checkpoints.checkpoint import OperatorStateHandle
from ..schema.serializers import BYTES, Serializer

V = TypeVar("V")


class OperatorListState(Generic[V]):
    """A subtask's list of elements of one operator state."""

    def __init__(self, elements: list[bytes], serializer: Serializer[V]) -> None:
        self._elements = elements
        self._serializer = serializer

    def get(self) -> list[V]:
        """The elements."""
        return [self._serializer.deserialize(e) for e in self._elements]

    def add(self, value: V) -> None:
        """Append an element."""
        self._elements.append(self._serializer.serialize(value))

    def update(self, values: Iterable[V]) -> None:
        """Replace all elements."""
        self._elements[:] = [self._serializer.serialize(v) for v in values]

    def clear(self) -> None:
        """Remove all elements."""
        self._elements.clear()


class OperatorStateBackend:
    """List and union-list states of one operator subtask."""

    def __init__(
        self,
        operator_id: str,
        subtask_index: int,
        restored: OperatorStateHandle | None = None,
    ) -> None:
        self.operator_id = operator_id
        self.subtask_index = subtask_index
        self._lists: dict[str, list[bytes]] = {}
        self._unions: dict[str, list[bytes]] = {}
        if restored is not None:
            self._lists = {k: list(v) for k, v in restored.list_states.items()}
            self._unions = {k: list(v) for k, v in restored.union_states.items()}

    def list_state(self, name: str, serializer: Serializer[V] = BYTES) -> OperatorListState[V]:  # type: ignore[assignment]
        """A list state: redistributed evenly when the parallelism changes."""
        self._check_unique(name, self._unions, "union-list")
        return OperatorListState(self._lists.setdefault(name, []), serializer)

    def union_list_state(
        self, name: str, serializer: Serializer[V] = BYTES  # type: ignore[assignment]
    ) -> OperatorListState[V]:
        """A union-list state: every subtask restores the union of all subtasks' elements."""
        self._check_unique(name, self._lists, "list")
        return OperatorListState(self._unions.setdefault(name, []), serializer)

    def _check_unique(self, name: str, other: dict[str, list[bytes]], kind: str) -> None:
        if name in other:
            raise ValueError(f"operator state {name!r} is already registered as {kind} state")

    def snapshot(self) -> OperatorStateHandle:
        """The subtask's operator state as stored in a checkpoint."""
        return OperatorStateHandle(
            self.operator_id, self.subtask_index,
            {k: tuple(v) for k, v in self._lists.items()},
            {k: tuple(v) for k, v in self._unions.items()},
        )


def redistribute(
    handles: Sequence[OperatorStateHandle], new_parallelism: int
) -> list[OperatorStateHandle]:
    """Operator state of ``new_parallelism`` subtasks from the old subtasks' handles.

    List state: every element of every old subtask (in subtask order) goes to exactly
    one new subtask, in contiguous parts whose sizes differ by at most one. Union
    state: each new subtask gets all elements.
    """
    if new_parallelism < 1:
        raise ValueError(f"parallelism must be >= 1, got {new_parallelism}")
    ordered = sorted(handles, key=lambda h: h.subtask_index)
    operator_ids = {h.operator_id for h in ordered}
    if len(operator_ids) > 1:
        raise ValueError(f"handles of several operators: {sorted(operator_ids)}")
    operator_id = ordered[0].operator_id if ordered else ""
    names = sorted({n for h in ordered for n in h.list_states})
    unions = sorted({n for h in ordered for n in h.union_states})
    lists: list[dict[str, tuple[bytes, ...]]] = [{} for _ in range(new_parallelism)]
    for name in names:
        elements = [e for h in ordered for e in h.list_states.get(name, ())]
        for index in range(new_parallelism):
            start = index * len(elements) // new_parallelism
            end = (index + 1) * len(elements) // new_parallelism
            lists[index][name] = tuple(elements[start:end])
    union = {name: tuple(e for h in ordered for e in h.union_states.get(name, ()))
             for name in unions}
    return [OperatorStateHandle(operator_id, index, lists[index], dict(union))
            for index in range(new_parallelism)]
