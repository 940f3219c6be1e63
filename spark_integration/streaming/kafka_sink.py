"""Exactly-once outputs: a batch's output rows to a Kafka topic, committed by the tasks.

Give a :class:`KafkaOutputSink` as the ``sink`` of :func:`stateful_foreach_batch`
and every subtask's task writes its outputs of a micro-batch to ``topic`` itself, in
one Kafka transaction of its own that also commits its part of the checkpoint (a
transactional id per application, operator and subtask): no output row goes
through the driver. The driver completes the checkpoint once every subtask
committed; a batch Spark runs again after a crash reuses what its subtasks committed
instead of computing them again. A consumer reading with
``isolation.level=read_committed`` (librdkafka's default, so kcat and
confluent-kafka; the Java console consumer needs ``--isolation-level
read_committed``) sees every batch's outputs exactly once, whatever crashed when.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kafka_changelog.kafka.transactional_commit import OutputRecord

#: Header carrying the micro-batch id of every output record.
BATCH_HEADER = "kafka-changelog-batch"
#: Header carrying the id of the checkpoint committed with the record: unique per batch
#: of an application, also when a new ``checkpointLocation`` starts batch ids at 0 again.
CHECKPOINT_HEADER = "kafka-changelog-checkpoint"


def json_value(row: dict[str, Any]) -> bytes:
    """The row as a JSON object (missing values and NaN become null; values JSON has no
    type for, such as timestamps, their ``str``)."""
    clean = {k: (None if _missing(v) else v) for k, v in row.items()}
    return json.dumps(clean, default=str, separators=(",", ":")).encode()


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class KafkaOutputSink:
    """Where a stateful query's outputs go, exactly once (see the module docstring)."""

    #: Output topic (it must exist, or the brokers must create topics on first use).
    topic: str
    #: Column whose value (as text) is the record key; None: no key.
    key_column: str | None = None
    #: Row -> record value; default :func:`json_value`.
    serialize: Callable[[dict[str, Any]], bytes] = json_value
    #: Stable per application and operator across restarts, unique among running
    #: queries. Default: ``kafka-changelog-<application>-<operator_id>``.
    transactional_id: str | None = None
    #: Extra librdkafka settings of the transactional producer.
    producer_config: dict[str, Any] = field(default_factory=dict)

    def transactional_id_for(self, application: str, operator_id: str) -> str:
        """The prefix of the transactional ids this sink commits with (one per subtask:
        ``<prefix>-<subtask>``)."""
        return self.transactional_id or f"kafka-changelog-{application}-{operator_id}"

    def records(self, outputs: pd.DataFrame, batch_id: int,
                checkpoint_id: int) -> Iterator[OutputRecord]:
        """The output records of one batch, committed with checkpoint ``checkpoint_id``."""
        return self.records_of(outputs.to_dict("records"), batch_id, checkpoint_id)

    def records_of(self, rows: Iterable[dict[str, Any]], batch_id: int,
                   checkpoint_id: int) -> Iterator[OutputRecord]:
        """The output records of ``rows`` (plain values), committed with checkpoint
        ``checkpoint_id``."""
        headers = ((BATCH_HEADER, str(batch_id).encode()),
                   (CHECKPOINT_HEADER, str(checkpoint_id).encode()))
        for row in rows:
            key = row.get(self.key_column) if self.key_column is not None else None
            yield OutputRecord(self.topic, self.serialize(row), _key_bytes(key), headers)


def _key_bytes(key: Any) -> bytes | None:
    if _missing(key):
        return None
    return bytes(key) if isinstance(key, (bytes, bytearray)) else str(key).encode()
