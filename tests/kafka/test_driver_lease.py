"""One driver at a time per application, against a real broker.

A second driver of another Spark query waits for the holder's lease and is refused
naming it; a driver of the same query (a restart from its checkpointLocation) takes over
at once, and from then on the zombie can commit neither a checkpoint nor its tasks'
outputs; each checkpoint id is committed once. An open transaction of another
application stalls neither the hold nor the tasks' look for earlier commits.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.driver_lease import DriverLease, driver_transactional_id
from kafka_changelog.kafka.task_commit import SubtaskCommitter, fence
from kafka_changelog.kafka.transactional_commit import OutputRecord
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.checkpoints.checkpoint_store import checkpoint_key
from kafka_changelog.state.checkpoints.driver_claim import (
    ApplicationHeldError,
    DriverClaim,
    DriverFencedError,
    DriverIdentity,
)
from kafka_changelog.state.checkpoints.subtask_commit import SubtaskCommit

pytestmark = pytest.mark.broker

APP, OPERATOR = "orders", "totals"
#: Another host's driver: its liveness cannot be told from here, only from its lease.
REMOTE = DriverIdentity("r" * 32, "remote-host", 4242, "1")


@pytest.fixture
def config(kafka_cluster: Any) -> CheckpointStoreConfig:
    config = CheckpointStoreConfig(bootstrap_servers=kafka_cluster.bootstrap_servers,
                                   topic=f"dl-{uuid.uuid4().hex[:8]}-checkpoints")
    KafkaCheckpointStore(config).close()  # creates the topic
    return config


@pytest.fixture
def stores(config: CheckpointStoreConfig) -> Iterator[list[KafkaCheckpointStore]]:
    """Two drivers' stores (processes of their own, as far as the topic can tell)."""
    opened = [KafkaCheckpointStore(config), KafkaCheckpointStore(config)]
    yield opened
    for store in opened:
        store.close()


def lease(store: KafkaCheckpointStore, identity: DriverIdentity | None = None,
          lease_s: float = 60.0) -> DriverLease:
    held = DriverLease(store, APP, lease_s, identity)
    store.leases[APP] = held
    return held


def a_checkpoint(checkpoint_id: int, marker: str) -> CompletedCheckpoint:
    return CompletedCheckpoint(APP, checkpoint_id, 1_700_000_000_000, 128, (), (),
                               {"driver": marker})


def committed(config: CheckpointStoreConfig) -> list[tuple[bytes, bytes | None]]:
    """Every committed (key, value) of the checkpoint topic, in order."""
    consumer = Consumer({**config.consumer(), "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(config.topic, 0, 0)])
        found = []
        while True:
            message = consumer.poll(10)
            assert message is not None, f"no end of {config.topic} within 10 s"
            if message.error():
                return found
            found.append((message.key(), message.value()))
    finally:
        consumer.close()


def test_a_driver_of_another_query_waits_for_the_lease_then_is_refused_naming_the_holder(
        stores: list[KafkaCheckpointStore]) -> None:
    holder = lease(stores[0])
    claim = holder.acquire("query-1", running=lambda: True)
    assert claim.epoch == 1
    second = lease(stores[1], REMOTE)
    started = time.monotonic()
    with pytest.raises(ApplicationHeldError) as refused:
        second.acquire("query-2", wait_s=2.0)
    assert time.monotonic() - started >= 2.0
    message = str(refused.value)
    assert f"application {APP!r} is held by driver {claim.driver.driver_id[:8]}" in message
    assert f"pid {claim.driver.pid}" in message and "Spark query query-1" in message
    assert "a second driver would process the input twice" in message
    # The holder goes on; once it releases the application, the other one takes it.
    holder.heartbeat()
    holder.release()
    assert second.acquire("query-2", wait_s=2.0).epoch == 2


def test_of_two_drivers_claiming_at_once_one_holds_and_the_other_is_refused(
        stores: list[KafkaCheckpointStore]) -> None:
    """Two drivers of different queries race for fresh applications: whatever the broker
    answers the one whose producer the other fenced, exactly one holds each application,
    the other is refused with ApplicationHeldError (never another error), and the holder's
    clean stop releases the claim."""
    identities = [DriverIdentity("a" * 32, "host-a", 1, "1"),
                  DriverIdentity("b" * 32, "host-b", 2, "1")]
    for round_ in range(3):
        application = f"race-{round_}"
        leases = [DriverLease(store, application, 60.0, identity)
                  for store, identity in zip(stores, identities, strict=True)]
        for store, held in zip(stores, leases, strict=True):
            store.leases[application] = held
        outcomes: list[object] = [None, None]

        def claim(i: int, leases: list[DriverLease] = leases,
                  outcomes: list[object] = outcomes) -> None:
            try:
                outcomes[i] = leases[i].acquire(f"query-{i}", wait_s=3.0)
            except Exception as exc:  # the assertion below names it
                outcomes[i] = exc

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        claims = [o for o in outcomes if isinstance(o, DriverClaim)]
        refusals = [o for o in outcomes if isinstance(o, ApplicationHeldError)]
        assert len(claims) == 1 and len(refusals) == 1, outcomes
        assert claims[0].epoch == 1
        assert f"held by driver {claims[0].driver.driver_id[:8]}" in str(refusals[0])
        assert stores[0].driver_claim(application) == claims[0]
        # The loser fenced the holder's producer on its way; the holder still frees the
        # application at once when it stops.
        winner = outcomes.index(claims[0])
        leases[winner].release()
        other = stores[1 - winner]
        other.catch_up(30.0, only_for=application)
        released = other.driver_claim(application)
        assert released is not None and released.released and released.epoch == 1


def test_a_driver_of_the_same_query_takes_over_and_the_zombie_commits_nothing(
        config: CheckpointStoreConfig, stores: list[KafkaCheckpointStore]) -> None:
    zombie_store, new_store = stores
    zombie = lease(zombie_store, REMOTE)
    zombie.acquire("query-1")
    zombie_store.commit(a_checkpoint(1, "zombie"))
    # The same Spark query restarted elsewhere (its checkpointLocation): no wait.
    started = time.monotonic()
    takeover = lease(new_store).acquire("query-1", wait_s=30.0)
    assert time.monotonic() - started < 10 and takeover.epoch == 2
    # Both planned checkpoint 2 from checkpoint 1; only the new driver's commit lands.
    with pytest.raises(DriverFencedError) as fenced:
        zombie_store.commit(a_checkpoint(2, "zombie"))
    assert f"is now held by driver {takeover.driver.driver_id[:8]}" in str(fenced.value)
    assert "epoch 2" in str(fenced.value)
    new_store.commit(a_checkpoint(2, "new"))
    with pytest.raises(DriverFencedError):
        zombie.heartbeat()
    written = [value for key, value in committed(config)
               if key == checkpoint_key(APP, 2).encode()]
    assert [CompletedCheckpoint.from_bytes(v).properties["driver"]
            for v in written if v is not None] == ["new"]
    fresh = KafkaCheckpointStore(config)
    try:
        assert fresh.latest(APP) == a_checkpoint(2, "new")
        claim = fresh.driver_claim(APP)
        assert claim is not None and claim.epoch == 2 and claim == new_store.driver_claim(APP)
    finally:
        fresh.close()


def a_commit(subtask: int, marker: str) -> SubtaskCommit:
    return SubtaskCommit(APP, OPERATOR, 2, subtask, 2, 1, "query-1", int(time.time() * 1000),
                         1, f"state-{marker}".encode(), "{}")


def committed_outputs(config: CheckpointStoreConfig, topic: str) -> list[bytes]:
    output = CheckpointStoreConfig(bootstrap_servers=config.bootstrap_servers, topic=topic)
    return [value for _, value in committed(output) if value is not None]


def test_a_zombie_drivers_tasks_refuse_to_commit_their_outputs(
        config: CheckpointStoreConfig, stores: list[KafkaCheckpointStore],
        make_topic: Any) -> None:
    output = make_topic()
    zombie_store, new_store = stores
    zombie = lease(zombie_store, REMOTE).acquire("query-1").holder()
    floor = zombie_store.position
    early = SubtaskCommitter(config, "tid-0")  # a zombie task that started before
    late = SubtaskCommitter(config, "tid-1")
    try:
        assert early.find(a_commit(0, "z").key, floor, lambda _: True, zombie) is None
        lease(new_store).acquire("query-1")
        fence(config, ["tid-0", "tid-1"])  # what the new driver does after its claim
        # Fenced at its commit, the early task looks again and finds the new claim.
        with pytest.raises(DriverFencedError) as fenced:
            early.commit([OutputRecord(output, b"zombie-0")], a_commit(0, "z"), floor,
                         holder=zombie)
        assert "refused: application 'orders' is now held by driver" in str(fenced.value)
        assert "(epoch 1); that driver is a zombie" in str(fenced.value)
        # A task that starts only now sees the claim before it computes anything.
        with pytest.raises(DriverFencedError):
            late.find(a_commit(1, "z").key, floor, lambda _: True, zombie)
    finally:
        early.close()
        late.close()
    assert committed_outputs(config, output) == []
    assert new_store.subtask_commits(APP, OPERATOR) == {}


def test_an_open_transaction_of_another_application_stalls_neither_hold_nor_tasks(
        kafka_cluster: Any, config: CheckpointStoreConfig,
        stores: list[KafkaCheckpointStore]) -> None:
    store = stores[0]
    held = lease(store).acquire("query-1")
    store.commit(a_checkpoint(1, "before"))
    other = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers,
                      "transactional.id": driver_transactional_id("another")})
    other.init_transactions(30)
    other.begin_transaction()
    # Another application's task died inside its transaction (open for a minute).
    other.produce(config.topic, key=b"another/subtask/op/00000", value=b"x")
    other.flush(30)
    committer = SubtaskCommitter(config, "tid-0")
    try:
        started = time.monotonic()
        floor = store.position
        store.catch_up(120, only_for=APP)
        assert lease(store).acquire("query-1").epoch == held.epoch + 1
        store.commit(a_checkpoint(2, "after"))
        assert committer.find(a_commit(0, "x").key, floor, lambda _: True,
                              store.driver_claim(APP).holder()) is None  # type: ignore[union-attr]
        assert time.monotonic() - started < 20
        assert store.latest(APP) == a_checkpoint(2, "after")
    finally:
        committer.close()
        with contextlib.suppress(KafkaException):  # timed out and aborted by the broker
            other.abort_transaction(30)
