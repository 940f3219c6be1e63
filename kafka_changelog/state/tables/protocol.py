"""What the keyed backend, restore, materialization and the readers need of a working copy.

A *state table* holds the entries of a set of key groups, per registered state and
key, all as bytes: a value (value, reducing and aggregating states), a list of values,
or a map. Two implementations: :class:`~kafka_changelog.state.tables.memory.StateTable` (in
memory, the default) and :class:`~kafka_changelog.state.rocksdb.table.RocksDBStateTable`
(one RocksDB per store directory). Their :meth:`KeyedStateTable.serialize_group` give
the same bytes for the same state, so snapshots restore into either.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..schema.kinds import Entry
from ..schema.op_run import OpRun
from ..schema.ops import OpKind, StateMeta, StateOp


@runtime_checkable
class KeyedStateTable(Protocol):
    """The working copy of keyed state: registrations plus entries per key group."""

    @property
    def metas(self) -> Mapping[str, StateMeta]:
        """Registered states by name (read only: register through :meth:`register`)."""
        ...

    def register(self, meta: StateMeta) -> None:
        """Register a state; a different kind or serializer under the same name raises
        :class:`~kafka_changelog.state.errors.StateMismatchError`."""
        ...

    def apply(self, key_group: int, op: StateOp) -> None:
        """Apply one logged mutation (its state must be registered)."""
        ...

    def apply_batch(self, ops: Sequence[tuple[int, StateOp]]) -> None:
        """Apply (key group, op) pairs in order, as :meth:`apply` one by one would (a
        restore replaying the changelog: a table may look keys up in bulk). On an error,
        the ops before the failing one are applied."""
        ...

    def apply_columns(
        self, state: str, op: OpKind, key_groups: Sequence[int], keys: Sequence[bytes],
        map_keys: Sequence[bytes | None] | None = None,
        values: Sequence[bytes | None] | None = None,
        items: Sequence[tuple[bytes, ...] | None] | None = None,
    ) -> None:
        """Apply many mutations of one state and kind, in order: op ``i`` is
        ``StateOp(state, op, keys[i], map_keys[i], values[i], items[i])`` in key group
        ``key_groups[i]`` (a column that is None is None for all). The same result as
        :meth:`apply` of each (bulk state)."""
        ...

    def get(self, key_group: int, state: str, key: bytes) -> Entry | None:
        """The entry of ``key`` (None if absent). A map comes ordered by map key."""
        ...

    def get_map_value(self, key_group: int, state: str, key: bytes,
                      map_key: bytes) -> bytes | None:
        """One value of a map entry (None if absent): a point lookup."""
        ...

    def get_map_values(self, key_groups: Sequence[int], state: str, keys: Sequence[bytes],
                       map_keys: Sequence[bytes]) -> list[bytes | None]:
        """:meth:`get_map_value` of each ``(key_groups[i], state, keys[i], map_keys[i])``
        (one multi-get for a RocksDB table)."""
        ...

    def key_groups(self) -> list[int]:
        """Key groups holding at least one entry, ascending."""
        ...

    def has_entries(self, key_group: int) -> bool:
        """Whether ``key_group`` holds at least one entry."""
        ...

    def entries(self, key_group: int) -> Iterator[tuple[str, bytes, Entry]]:
        """(state, key, entry) of the key group, ordered by state name then key."""
        ...

    def state_entries(self, key_group: int, state: str) -> Iterator[tuple[bytes, Entry]]:
        """(key, entry) of one state in the key group, ordered by key: proportional to
        that state's entries, not the key group's."""
        ...

    def entry_count(self) -> int:
        """Entries in all: a key of a value or list state is one entry, a map counts each
        of its entries (so an op's change of the count is whether the one stored entry it
        writes existed, never whether a whole map is empty)."""
        ...

    def serialize_group(self, key_group: int) -> bytes:
        """The key group's state (``schemas/key_group_state.avsc``), in a deterministic
        order: states by name, entries by key, map entries by map key."""
        ...

    def load_group(self, key_group: int, data: bytes) -> None:
        """Replace the key group's state with a serialized one (registering its states)."""
        ...

    def close(self) -> None:
        """Release what the table holds (files, handles); it is not used afterwards."""
        ...


@runtime_checkable
class BulkLoadTable(KeyedStateTable, Protocol):
    """A table that loads many key groups' snapshots at once (a restore's whole states)."""

    def load_groups(self, groups: Iterable[tuple[int, bytes]],
                    tail: Mapping[int, Sequence[OpRun]] | None = None) -> None:
        """:meth:`load_group` of each (key group, serialized state) in order, then the
        ops of ``tail`` (key group -> its runs of ops in log order) as :meth:`apply` of
        each would: the same result, however the table writes them."""
        ...


@runtime_checkable
class HostStoreTable(KeyedStateTable, Protocol):
    """A working copy kept in a host-local store directory across tasks: it is closed
    and reopened in place, made durable and copied, and it marks the keys mutations
    touch by change epoch (the keys an incremental materialization must write).

    Invariants: after :meth:`flush`, reopening the directory gives exactly the state at
    the flush; :meth:`copy_to` copies the state as of the last flush; a key touched
    after :meth:`start_change_epoch` returned ``e`` carries a mark of an epoch ``> e``,
    so :meth:`clear_changes` ``(e)`` keeps it.
    """

    def reopen(self) -> None:
        """Open the store again after :meth:`close` (no-op when open)."""
        ...

    def flush(self) -> None:
        """Make the store durable as it is now."""
        ...

    def copy_to(self, path: str | Path) -> None:
        """Write a copy of the store as of its last :meth:`flush` into new directory
        ``path``."""
        ...

    def start_change_epoch(self) -> int:
        """End the current change epoch and return it."""
        ...

    def clear_changes(self, upto: int) -> None:
        """Forget the marks of change epochs up to ``upto``."""
        ...

    def recounted(self, entry_count: int) -> AbstractContextManager[None]:
        """Within the block, bulk writes need not keep the entry count (they skip reading
        whether each key existed); after it the count is ``entry_count``, that of the state
        the block leads to, known beforehand (on an error, the count is the store's)."""
        ...


__all__ = ["BulkLoadTable", "Entry", "HostStoreTable", "KeyedStateTable"]
