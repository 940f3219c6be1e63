"""The model of the soak: the state and outputs the clickstream job must have, computed
from the input it was given.

Every event is applied once, whatever the checkpointLocation: a Spark query with a new
checkpointLocation starts at the offsets the state's latest checkpoint recorded
(``starting_offsets``), and a batch that would apply input again is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from examples.clickstream import expected_state
from examples.events import events


@dataclass
class InputModel:
    """The input produced so far and the queries that read it."""

    events: int
    users: int
    seed: int = 7
    #: Events produced to the input topic so far.
    produced: int = 0

    def __post_init__(self) -> None:
        self._all = list(events(self.events, self.users, self.seed))

    def next_events(self, up_to: int) -> list[dict[str, Any]]:
        """The events to produce to reach ``up_to`` produced (marks them produced)."""
        up_to = min(up_to, self.events)
        batch, self.produced = self._all[self.produced:up_to], max(self.produced, up_to)
        return batch

    def applied(self) -> list[dict[str, Any]]:
        """Every event the application's state must have folded in, in order."""
        return self._all[:self.produced]

    def prefix_problems(self, found: dict[str, dict[str, Any]]) -> list[str]:
        """How ``found`` (users' states at a checkpoint taken while the job ran) differs from
        the fold of each user's first events: a checkpoint covers a prefix of every input
        partition, hence of every user's events, as many as its ``events`` count."""
        per_user: dict[str, list[dict[str, Any]]] = {}
        for event in self.applied():
            per_user.setdefault(event["user"], []).append(event)
        problems = []
        for user, state in sorted(found.items()):
            count = state["events"] or 0
            mine = per_user.get(user, [])
            if count > len(mine):
                problems.append(f"{user} counts {count} events, the input has {len(mine)}")
            elif not count and any(state.values()):
                problems.append(f"{user} has state {state} without events")
            elif count and expected_state(iter(mine[:count]))[user] != state:
                problems.append(f"{user}: {state} is not the fold of its first {count} "
                                f"events, {expected_state(iter(mine[:count]))[user]}")
        return problems

    def expected(self) -> dict[str, dict[str, Any]]:
        """Every user's state once the application processed everything produced."""
        return expected_state(iter(self.applied()))


def overcounted(found: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any]]
                ) -> list[str]:
    """Users whose state counts more events than the model: lost for good (the state never
    goes back)."""
    return [user for user, state in found.items()
            if (state["events"] or 0) > expected.get(user, {}).get("events", 0)]
