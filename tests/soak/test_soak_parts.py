"""The soak's parts that need no cluster: the schedule, the model, the tolerances."""

from __future__ import annotations

import random
from typing import Any

import pytest

from examples.clickstream import expected_state
from examples.events import events

from .faults import FaultKind, draw_schedule
from .harness import VARIANTS, Soak, SoakSettings
from .model import InputModel, overcounted
from .resources import Tolerance, Verdict


def test_a_seed_draws_the_same_schedule_again() -> None:
    settings = SoakSettings(5, batches=500, faults=50)
    assert Soak.plan(settings) == Soak.plan(settings)
    assert Soak.plan(settings) != Soak.plan(SoakSettings(6, batches=500, faults=50))


def test_every_kind_comes_in_any_run_of_as_many_faults_and_a_rescale_changes_parallelism(
) -> None:
    schedule = draw_schedule(random.Random(3), 100, 30, 2, sorted(VARIANTS), "per-key/memory")
    assert [f.batch for f in schedule] == sorted({f.batch for f in schedule})
    assert all(2 <= f.batch < 100 for f in schedule)
    for start in range(len(schedule) - len(FaultKind) + 1):
        assert {f.kind for f in schedule[start:start + len(FaultKind)]} == set(FaultKind)
    parallelism = 2
    for fault in schedule:
        if fault.kind is FaultKind.RESCALE:
            assert fault.parallelism != parallelism
        parallelism = fault.parallelism
    with pytest.raises(ValueError, match="need at least"):
        draw_schedule(random.Random(3), 5, 4, 2, sorted(VARIANTS), "per-key/memory")


def test_the_model_applies_every_event_once() -> None:
    model = InputModel(60, users=5)
    assert len(model.next_events(40)) == 40
    assert len(model.next_events(1000)) == 20  # never more than the input has
    assert model.produced == 60
    expected = model.expected()
    once = expected_state(events(60, 5))
    assert expected == once and sum(s["events"] for s in once.values()) == 60
    first = expected_state(events(40, 5))
    assert overcounted(once, first) != []
    assert overcounted(first, once) == []


def test_a_checkpoint_s_state_is_each_user_s_fold_of_its_first_events() -> None:
    model = InputModel(60, users=5)
    model.next_events(30)
    model.next_events(60)
    full = model.expected()
    assert model.prefix_problems(full) == []
    # Every user's first events (a checkpoint in the middle of the input).
    per_user: dict[str, list[dict[str, Any]]] = {}
    for event in model.applied():
        per_user.setdefault(event["user"], []).append(event)
    partial = {user: expected_state(iter(mine[:len(mine) - 3]))[user]
               for user, mine in per_user.items()}
    assert model.prefix_problems(partial) == []
    user = sorted(partial)[0]
    doubled = {**partial, user: {**partial[user], "spent": (partial[user]["spent"] or 0) + 1}}
    assert len(model.prefix_problems(doubled)) == 1
    more = {**full, user: {**full[user], "events": full[user]["events"] + 1}}
    assert "the input has" in model.prefix_problems(more)[0]
    empty: dict[str, Any] = {"events": None, "spent": None, "kinds": {}, "last_pages": []}
    assert model.prefix_problems({"user-x": empty}) == []
    assert model.prefix_problems({"user-x": {**empty, "kinds": {"view": 1}}}) != []


def test_a_figure_is_flat_within_its_tolerance() -> None:
    limit = Tolerance(1.5, 10)
    assert limit.verdict(100, 160) is Verdict.FLAT
    assert limit.verdict(100, 161) is Verdict.MISS
