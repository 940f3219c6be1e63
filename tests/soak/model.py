"""The model of the soak: the state and outputs the clickstream job must have, computed
from the input it was given.

A Spark query with a new checkpointLocation reads its Kafka input from the start again
(``startingOffsets=earliest``): it is a new query, whose events are folded into the state
the application already has. The soak starts one only when the previous query processed
all the input there was, so the events applied are the input's first ``n_1`` events,
then its first ``n_2``, ..., then all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from examples.clickstream import expected_state
from examples.events import events

#: Added to the ``seq`` of a later query's events so that the model's order (by ``seq``)
#: puts them after the earlier queries'.
GENERATION_SEQ = 1_000_000_000


@dataclass
class InputModel:
    """The input produced so far and the queries that read it."""

    events: int
    users: int
    seed: int = 7
    #: Events produced to the input topic so far.
    produced: int = 0
    #: Events produced when each earlier query ended (a fresh checkpointLocation each).
    ended_queries: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._all = list(events(self.events, self.users, self.seed))

    def next_events(self, up_to: int) -> list[dict[str, Any]]:
        """The events to produce to reach ``up_to`` produced (marks them produced)."""
        up_to = min(up_to, self.events)
        batch, self.produced = self._all[self.produced:up_to], max(self.produced, up_to)
        return batch

    def applied(self) -> list[dict[str, Any]]:
        """Every event the application's state must have folded in, in order."""
        applied = []
        for query, count in enumerate([*self.ended_queries, self.produced]):
            applied += [{**e, "seq": e["seq"] + query * GENERATION_SEQ}
                        for e in self._all[:count]]
        return applied

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
