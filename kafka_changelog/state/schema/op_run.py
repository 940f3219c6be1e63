"""Ops of one state and kind held as columns: what a restore merges into a snapshot.

A restore into a bulk-loading table holds its changelog tail in memory until each key
group's snapshot is loaded, then applies the key group's ops to it. Held as
:class:`OpRun` columns (decoded column-wise from the changelog records), the tail costs
no op object per change and reaches the table in the shape of
:meth:`~kafka_changelog.state.tables.protocol.KeyedStateTable.apply_columns`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ops import OpKind, StateOp


@dataclass(frozen=True, slots=True)
class OpRun:
    """Ops of one ``state`` and one ``op`` kind in one key group, in log order.

    Op ``i`` is ``StateOp(state, op, keys[i], map_keys[i], values[i], items[i])``; a
    column that is None is None for every op. Invariant: every column given is as long
    as ``keys`` (the lists may grow while a run is collected, all together).
    """

    state: str
    op: OpKind
    keys: list[bytes]
    map_keys: list[bytes | None] | None = None
    values: list[bytes | None] | None = None
    items: list[tuple[bytes, ...] | None] | None = None

    @classmethod
    def started(cls, op: StateOp) -> OpRun:
        """A run of ``op`` alone, with every column (so :meth:`add` can extend it)."""
        return cls(op.state, op.op, [op.key], [op.map_key], [op.value], [op.values])

    def add(self, op: StateOp) -> None:
        """Append ``op`` (of this run's state and kind) to a run made by :meth:`started`."""
        assert self.map_keys is not None and self.values is not None
        assert self.items is not None
        self.keys.append(op.key)
        self.map_keys.append(op.map_key)
        self.values.append(op.value)
        self.items.append(op.values)

    def __len__(self) -> int:
        return len(self.keys)


__all__ = ["OpRun"]
