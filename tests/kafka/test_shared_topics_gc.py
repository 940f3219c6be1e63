"""Several applications on one changelog, snapshot and checkpoint topic, GC running often.

Each application's garbage collection must keep what *any* application sharing the
topics still needs: the handles of their stored checkpoints, where each may still
write (log floors), and an application's first writes before its first checkpoint
(guards). Restores of both applications stay exact throughout, and GC still frees
records nobody needs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kafka.apps import App

pytestmark = pytest.mark.broker


@pytest.fixture
def apps(kafka_cluster: Any) -> Iterator[tuple[App, App]]:
    topics = f"shared-{uuid.uuid4().hex[:8]}"
    alpha, beta = App(kafka_cluster, "alpha", topics), App(kafka_cluster, "beta", topics)
    yield alpha, beta
    alpha.close()
    beta.close()


def test_gc_of_one_application_keeps_what_another_needs(apps: tuple[App, App]) -> None:
    alpha, beta = apps
    for round_ in range(3):
        alpha.open(2)
        alpha.work(20, materialize=round_ == 1)
        alpha.commit(alpha.persist())
        alpha.close_backends()
    # beta's first checkpoint is persisted (its records are in the log) but not yet
    # committed while alpha commits, materializes and collects garbage many times.
    beta.open(2)
    beta.work(25)
    pending = beta.persist()
    for round_ in range(8):
        alpha.open(2 if round_ % 2 else 3)
        alpha.work(15, materialize=True)
        alpha.commit(alpha.persist())
        assert alpha.coordinator.last_garbage.error is None, alpha.coordinator.last_garbage
        alpha.close_backends()
        alpha.assert_restores_exactly(1)
    beta.commit(pending)
    beta.assert_restores_exactly(3)
    # Long-lived writers on both sides: beta keeps its backends across checkpoints and
    # writes ahead of its next commit while alpha collects.
    for round_ in range(10):
        beta.work(10, materialize=round_ % 3 == 2)
        beta_pending = beta.persist()
        beta.work(5)  # written after the persist: belongs to beta's next checkpoint
        alpha.open(2)
        alpha.work(10, materialize=round_ % 2 == 0)
        alpha.commit(alpha.persist())
        alpha.close_backends()
        beta.commit(beta_pending)
        alpha.assert_restores_exactly(2)
    # beta's last five events per subtask are not in a committed checkpoint yet.
    beta.commit(beta.persist())
    beta.assert_restores_exactly(1)
    alpha.assert_restores_exactly(4)
    # GC did free records both applications are done with.
    freed = alpha.coordinator.last_garbage.changelog_log_start
    assert freed and max(freed.values()) > 0, alpha.coordinator.last_garbage
