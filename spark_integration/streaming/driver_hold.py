"""The driver's hold on its application, taken before every batch.

One driver at a time runs an application (``kafka_changelog/state/checkpoints/driver_claim.py``):
before each batch the driver reads the checkpoint topic up to everything written for
its application, takes the application (its first batch, or after another driver took
it over) or checks it still holds it, and, after every new claim, fences the
transactional ids of its subtasks' output commits: a zombie driver's tasks then either
see the new claim or are fenced at their commit. Its own tasks carry the
:class:`DriverHolder` and refuse to commit once another driver claimed the application.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka_changelog.kafka.checkpoint_store import KafkaCheckpointStore
from kafka_changelog.kafka.driver_lease import DriverLease
from kafka_changelog.kafka.task_commit import TRANSACTION_TIMEOUT_MS, check_output_topics, fence
from kafka_changelog.state.checkpoints.driver_claim import DriverHolder
from kafka_changelog.state.history.coordinator import CheckpointCoordinator

from ..sessions.connect import connect_query_running, is_connect
from .config import StreamingStateConfig
from .kafka_sink import KafkaOutputSink
from .worker_resources import subtask_transactional_id


@dataclass(frozen=True)
class Hold:
    """What a batch runs under: its driver and where its tasks look for commits."""

    holder: DriverHolder
    #: The checkpoint topic's offset up to which the driver has read: a newer claim, or
    #: an earlier attempt's subtask commit, lies at or after it.
    floor: int


def hold_application(coordinator: CheckpointCoordinator, config: StreamingStateConfig,
                     query_id: str, sink: KafkaOutputSink | None, session: Any) -> Hold:
    """Take or check the driver's hold on ``config.application`` (module docstring);
    raises ``DriverFencedError`` or ``ApplicationHeldError`` naming the other driver.
    The hold is released once ``query_id`` no longer runs in ``session``."""
    store = coordinator.checkpoints
    assert isinstance(store, KafkaCheckpointStore)
    wait_s = TRANSACTION_TIMEOUT_MS / 1000 + store.config.request_timeout_s
    store.catch_up(wait_s, only_for=config.application)
    lease = DriverLease.of(store, config.application, config.driver_lease_s)
    claim = lease.check() if lease.claim is not None else lease.acquire(
        query_id, running=_query_running(session, query_id) if query_id else None)
    if sink is not None and lease.fenced_tasks_at != claim.epoch:
        # The tasks of whoever held the application before (a crashed or zombie driver)
        # may still run: fence every subtask's id (of this and of the last committed
        # parallelism) before looking at what they committed.
        check_output_topics(config.checkpoints(), [sink.topic])
        fence(config.checkpoints(), [subtask_transactional_id(config, sink, s)
                                     for s in range(_subtasks_ever(store, config))],
              sink.producer_config)
        lease.fenced_tasks_at = claim.epoch
        store.catch_up(wait_s, only_for=config.application)
    return Hold(claim.holder(), store.position)


def _query_running(session: Any, query_id: str) -> Callable[[], bool]:
    """Whether Spark query ``query_id`` is still active in ``session``'s Spark application.

    Asked of the state all sessions share: a ``foreachBatch`` function gets a clone of
    the query's session, whose own query manager knows no query. Under Spark Connect the
    function's session is the client's, which started the query: it is asked there.
    """
    if is_connect(session):
        return connect_query_running(session, query_id)

    def running() -> bool:
        jvm = session.sparkContext._jvm
        return bool(session._jsparkSession.sharedState().activeStreamingQueries()
                    .containsKey(jvm.java.util.UUID.fromString(query_id)))
    return running


def _subtasks_ever(store: KafkaCheckpointStore, config: StreamingStateConfig) -> int:
    """The most subtasks the operator may have run with: this run's parallelism, the last
    checkpoint's, and that of any pending subtask commit."""
    last = store.latest(config.application)
    old = {s.parallelism for s in last.subtasks_of(config.operator_id)} if last else set()
    return max([config.parallelism, *old,
                *(c.parallelism for c in store.subtask_commits(
                    config.application, config.operator_id).values())])


__all__ = ["Hold", "hold_application"]
