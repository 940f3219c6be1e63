"""Applications sharing a changelog or snapshot topic must share the checkpoint topic.

Against a real broker: a topic registered with one checkpoint topic, where an application's
checkpoint still names it, is refused to another checkpoint topic, naming both; the owner
itself, and a newcomer once nobody in the old checkpoint topic needs the topic, go on.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.client_settings import KafkaConnection
from kafka_changelog.kafka.handle import KafkaChangelogHandle, PartitionRange
from kafka_changelog.kafka.topic_owners import SharedTopicError, claim_topics
from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.state.checkpoints.checkpoint import (
    CompletedCheckpoint,
    KeyedStateHandle,
    SubtaskState,
)

pytestmark = pytest.mark.broker


def a_checkpoint(application: str, changelog: str) -> CompletedCheckpoint:
    key_groups = KeyGroupRange(0, 127)
    handle = KafkaChangelogHandle("backend", changelog, key_groups,
                                  [PartitionRange(0, 0, 5, key_groups, 500)], 1, 9, 0, 1)
    keyed = KeyedStateHandle("backend", key_groups, 1, None, (handle,))
    return CompletedCheckpoint(application, 1, 1_700_000_000_000, 128,
                               (SubtaskState("op", 0, 1, keyed, None),))


def test_a_topic_of_another_checkpoint_topic_is_refused_until_nobody_there_needs_it(
        kafka_cluster: Any, make_topic: Any) -> None:
    connection = KafkaConnection(bootstrap_servers=kafka_cluster.bootstrap_servers)
    changelog, snapshots = make_topic(), make_topic()
    first, second = (f"owners-{uuid.uuid4().hex[:8]}-checkpoints" for _ in range(2))
    topics = {"changelog": changelog, "snapshot": snapshots}
    claim_topics(connection, first, topics)
    store = KafkaCheckpointStore(CheckpointStoreConfig.on(connection, topic=first, retain=2))
    try:
        store.commit(a_checkpoint("orders", changelog))
        claim_topics(connection, first, topics)  # the owner again: fine
        with pytest.raises(SharedTopicError) as refused:
            claim_topics(connection, second, {"changelog": changelog})
        assert str(refused.value) == (
            f"changelog topic {changelog!r} is used by applications whose checkpoint topic "
            f"is {first!r}, not {second!r}: applications sharing a changelog or snapshot "
            "topic must share the checkpoint topic, or the garbage collection of one deletes "
            f"what the other needs. Set checkpoint_topic={first!r}, or give this application "
            "topics of its own")
        # The snapshot topic is named by no checkpoint there: it may move, and back.
        claim_topics(connection, second, {"snapshot": snapshots})
        claim_topics(connection, first, {"snapshot": snapshots})
        # Once no checkpoint in the first checkpoint topic names the changelog (its
        # application moved on, or was reset), another checkpoint topic may take it.
        for checkpoint_id in (2, 3):
            moved = a_checkpoint("orders", make_topic())
            for subsumed in store.commit(CompletedCheckpoint(
                    "orders", checkpoint_id, moved.timestamp_ms, 128, moved.subtasks)):
                store.discard("orders", subsumed.checkpoint_id)
        assert store.checkpoint_ids("orders") == [2, 3]
        claim_topics(connection, second, {"changelog": changelog})
    finally:
        store.close()
