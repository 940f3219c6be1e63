"""The states a stateful query declares up front, and those it drops.

A function reaches its states lazily (``state(descriptor)``), so without declarations
a state's new schema meets the old one only in a task, where a refusal fails the batch.
Declared states (``stateful_foreach_batch(states=...)``) are checked on the driver
before any task runs, against the registrations the application's latest checkpoint
recorded (checkpoint properties ``state.<name>``), and every task registers them before
the function runs: every subtask then records the new schema in the same batch.
Dropped states (``dropped_states=...``) have their entries deleted by every task (as
logged changes: the next materialization writes the key groups without them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.schema.descriptors import StateDescriptor
from kafka_changelog.state.schema.evolution import requested_meta
from kafka_changelog.state.schema.ops import StateMeta
from kafka_changelog.state.time.timers import TIMERS_STATE

from ..checkpoint_properties import STATE_PROPERTY_PREFIX, evolved_metas, state_properties


@dataclass(frozen=True)
class StateDeclarations:
    """Declared states (descriptors) and dropped state names of one operator.

    Invariants: names are unique, not the timers' reserved name, and no state is both
    declared and dropped (``ValueError`` naming it otherwise).
    """

    states: tuple[StateDescriptor, ...] = ()
    dropped: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [d.name for d in self.states]
        for name in {n for n in names if names.count(n) > 1}:
            raise ValueError(f"state {name!r} is declared more than once")
        for name in (*names, *self.dropped):
            if name == TIMERS_STATE:
                raise ValueError(f"state name {TIMERS_STATE!r} is reserved for timers")
        for name in set(names) & set(self.dropped):
            raise ValueError(f"state {name!r} is both declared and dropped")

    @classmethod
    def of(cls, states: Sequence[StateDescriptor], dropped: Sequence[str]) -> StateDeclarations:
        """Declarations from the query's arguments (a single string is one name)."""
        return cls(tuple(states), (dropped,) if isinstance(dropped, str) else tuple(dropped))

    def __bool__(self) -> bool:
        return bool(self.states or self.dropped)

    def checked_properties(self, application: str, operator: str,
                           recorded: Mapping[str, str]) -> dict[str, str]:
        """The ``state.*`` properties the next checkpoint records: the registrations of
        ``recorded`` (a checkpoint's properties) but the dropped ones, with each declared
        state's evolved registration. Raises
        :class:`~kafka_changelog.state.errors.StateSchemaError` naming the application,
        operator and state when a declaration cannot read what was written."""
        return state_properties(evolved_metas(
            application, operator, recorded, [requested_meta(d) for d in self.states],
            self.dropped))

    def apply(self, backend: ChangelogKeyedStateBackend) -> None:
        """Register the declared states on ``backend`` and delete the dropped ones'
        entries (both logged), before the function runs."""
        for descriptor in self.states:
            backend.register(descriptor)
        for name in self.dropped:
            backend.drop_state(name)


def registered_properties(registrations: Iterable[Sequence[str]], declared: Mapping[str, str],
                          declarations: StateDeclarations | None) -> dict[str, str]:
    """The ``state.*`` properties of the states the subtasks' backends hold
    (``registrations``: each subtask's ``StateMeta`` records as JSON, in subtask order)
    that neither ``declared`` (the declared and recorded ones) nor the dropped states
    name: undeclared states are recorded too, so that a state write knows them."""
    dropped = set(declarations.dropped) if declarations is not None else set()
    found: dict[str, StateMeta] = {}
    for records in registrations:
        for record in records:
            meta = StateMeta.from_record(json.loads(record))
            name = meta.state
            if (STATE_PROPERTY_PREFIX + name not in declared and name not in dropped
                    and name not in found):
                found[name] = meta
    return state_properties(found)


__all__ = ["StateDeclarations", "registered_properties"]
