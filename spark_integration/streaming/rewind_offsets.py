"""``starting_offsets``: where Spark's Kafka source continues a checkpoint's state.

Each checkpoint the streaming driver commits records the Kafka offsets its state has read
up to (``kafka_changelog/state/checkpoints/input_progress.py``), and the driver refuses a batch that
does not start there (``spark_integration/streaming/input_check.py``). A query with a
fresh ``checkpointLocation`` (a redeploy, a new cluster, after ``kafka-changelog rewind``)
started with ``.option("startingOffsets", starting_offsets(config))`` reads exactly the
input that came after the state's (see docs/exactly-once.md, "Input offsets").
"""

from __future__ import annotations

from collections.abc import Iterable

from kafka_changelog.kafka.access import connect_admin
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointView
from kafka_changelog.state.checkpoints.source_offsets import (
    SOURCE_OFFSETS_PROPERTY,
    SourceOffsetsError,
    parse_offsets,
    starting_offsets_json,
)

from .config import StreamingStateConfig


def starting_offsets(config: StreamingStateConfig | str, application: str | None = None,
                     checkpoint_id: int | None = None,
                     checkpoint_topic: str = "kafka-changelog-checkpoints",
                     topics: Iterable[str] | None = None, default: str | None = None) -> str:
    """The ``startingOffsets`` JSON (``{"topic": {"partition": offset}}``) of the input
    that follows checkpoint ``checkpoint_id`` (None: the latest) of ``application``: the
    input a query continues the state with, exactly.

    The recorded offsets are cumulative (every topic the state ever read); ``topics``
    keeps those of the topics the query subscribes to (Spark's Kafka source refuses a
    ``startingOffsets`` naming others). With ``default`` (e.g. ``"earliest"``), an
    application without state yet (no checkpoint, or none recording these topics) gets
    ``default``: one expression for a query's first deployment and every later one.

    ``config`` is the application's :class:`StreamingStateConfig` (its brokers, client
    settings, checkpoint topic and, unless given, application), or a bootstrap servers
    string (then ``application`` is required and ``checkpoint_topic`` is used). Raises
    :class:`SourceOffsetsError` when the checkpoint records no offsets (of ``topics``),
    or only those of some of ``topics`` (the others' partitions would need a start of
    their own), and ``CheckpointNotFoundError`` (naming the stored ids) when
    ``checkpoint_id`` is not stored.
    """
    if isinstance(config, StreamingStateConfig):
        store_config = CheckpointStoreConfig.on(config.connection(),
                                                topic=config.checkpoint_topic)
        application = application or config.application
    else:
        if not application:
            raise ValueError("starting_offsets: give the application with bootstrap servers")
        store_config = CheckpointStoreConfig(bootstrap_servers=config, topic=checkpoint_topic)
    assert application is not None
    if default is not None and not _topic_exists(store_config):
        return default  # no application has a checkpoint there yet
    with KafkaCheckpointView(store_config) as store:
        checkpoint = (store.latest(application) if checkpoint_id is None
                      else store.get(application, checkpoint_id))
    if checkpoint is None:
        if default is not None:
            return default
        raise SourceOffsetsError(f"application {application!r} has no checkpoint in "
                                 f"checkpoint topic {store_config.topic}")
    text = checkpoint.properties.get(SOURCE_OFFSETS_PROPERTY)
    where = f"checkpoint {checkpoint.checkpoint_id} of application {application!r}"
    recorded = parse_offsets(text, where) if text is not None else {}
    wanted = set(recorded) if topics is None else set(topics)
    offsets = {t: p for t, p in recorded.items() if t in wanted}
    if not offsets:
        if default is not None:
            return default
        if text is None:
            raise SourceOffsetsError(
                f"{where} records no input offsets (property {SOURCE_OFFSETS_PROPERTY}): it "
                "was not committed by a streaming query reading Kafka with this version")
        raise SourceOffsetsError(
            f"{where} records no input offsets of topic(s) {sorted(wanted)}; it records "
            f"those of: {', '.join(sorted(recorded))}")
    if set(offsets) != wanted:
        raise SourceOffsetsError(
            f"{where} records the input offsets of {sorted(offsets)} but not of "
            f"{sorted(wanted - set(offsets))}, which the state never read: give the query "
            "a startingOffsets JSON with every partition of those too (-2: earliest)")
    return starting_offsets_json(offsets)


def _topic_exists(config: CheckpointStoreConfig) -> bool:
    """Whether the checkpoint topic exists (reading a missing one would wait for it)."""
    _, metadata = connect_admin(config.admin(), config.request_timeout_s,
                                "starting_offsets: does the checkpoint topic exist")
    return config.topic in metadata.topics
