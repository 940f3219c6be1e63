"""Shared pieces of the state backend tests: a toy application over keyed state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kafka_changelog import KeyGroupRange, key_group_for_key, key_group_range_for_operator
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle
from kafka_changelog.state.schema.descriptors import (
    aggregating_state,
    list_state,
    map_state,
    reducing_state,
    value_state,
)
from kafka_changelog.state.schema.serializers import INT64, JSON, UTF8

MAX_P = 128

COUNT = value_state("count", INT64)
EVENTS = list_state("events", UTF8)
PAGES = map_state("pages", UTF8, INT64)
TOTAL = reducing_state("total", lambda a, b: a + b, INT64)
STATS = aggregating_state(
    "stats", lambda: {"n": 0, "max": 0}, lambda acc, v: {"n": acc["n"] + 1,
                                                        "max": max(acc["max"], v)}, JSON)


def apply_event(backend: ChangelogKeyedStateBackend, user: bytes, page: str, amount: int) -> None:
    """What the toy application does for one event."""
    backend.set_current_key(user)
    count = backend.state(COUNT)
    count.update((count.value() or 0) + 1)
    events = backend.state(EVENTS)
    events.add(page)
    if len(events.get()) > 5:
        events.update(events.get()[-3:])
    pages = backend.state(PAGES)
    pages.put(page, (pages.get(page) or 0) + 1)
    if amount == 0 and pages.contains("home"):
        pages.remove("home")
    backend.state(TOTAL).add(amount)
    backend.state(STATS).add(amount)
    if amount == 13:
        backend.state(COUNT).clear()


def model_apply(model: dict[bytes, dict[str, Any]], user: bytes, page: str, amount: int) -> None:
    """The same application on plain dicts."""
    s = model.setdefault(user, {"count": None, "events": [], "pages": {}, "total": None,
                                "stats": None})
    s["count"] = (s["count"] or 0) + 1
    s["events"].append(page)
    if len(s["events"]) > 5:
        s["events"] = s["events"][-3:]
    s["pages"][page] = s["pages"].get(page, 0) + 1
    if amount == 0 and "home" in s["pages"]:
        del s["pages"]["home"]
    s["total"] = amount if s["total"] is None else s["total"] + amount
    stats = s["stats"] or {"n": 0, "max": 0}
    s["stats"] = {"n": stats["n"] + 1, "max": max(stats["max"], amount)}
    if amount == 13:
        s["count"] = None


def read_user(backend: ChangelogKeyedStateBackend, user: bytes) -> dict[str, Any]:
    """Everything the toy application keeps for ``user``, through the state API."""
    backend.set_current_key(user)
    return {
        "count": backend.state(COUNT).value(),
        "events": backend.state(EVENTS).get(),
        "pages": dict(backend.state(PAGES).items()),
        "total": backend.state(TOTAL).get(),
        "stats": backend.state(STATS).get(),
    }


def users_in(users: Sequence[bytes], key_groups: KeyGroupRange) -> list[bytes]:
    return [u for u in users if key_groups.contains(key_group_for_key(u, MAX_P))]


def ranges(parallelism: int) -> list[KeyGroupRange]:
    return [key_group_range_for_operator(MAX_P, parallelism, i) for i in range(parallelism)]


def expected_for(model: dict[bytes, dict[str, Any]], users: Sequence[bytes]) -> dict[bytes, Any]:
    empty = {"count": None, "events": [], "pages": {}, "total": None, "stats": None}
    return {u: model.get(u, empty) for u in users}


def handles_of(states: Sequence[KeyedStateHandle]) -> list[KeyedStateHandle]:
    return list(states)
