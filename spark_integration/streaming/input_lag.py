"""How far an application's state is behind its Kafka input: the records of each input
topic-partition after the offsets the state's latest checkpoint holds.

The state's checkpoint records, per topic-partition of a Kafka source, the offset the
state has read up to (``spark.source_offsets``, see
:mod:`kafka_changelog.state.checkpoints.source_offsets`); the lag of a partition is its
latest offset (the end of the log) minus that offset. It is what an operator alerts on
for a stateful query (like a consumer group's lag): it grows while input arrives faster
than batches commit, and a query that stopped shows the input it has not applied yet.
Measured when asked (a Prometheus scrape), not per batch, so that it also moves while no
batch runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka.admin import AdminClient, OffsetSpec

from kafka_changelog.kafka.live_clients import new_admin
from kafka_changelog.kafka.offsets import list_offsets
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.checkpoints.source_offsets import recorded_source_offsets

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionLag:
    """One input topic-partition: where the state is and where the log ends."""

    topic: str
    partition: int
    #: The next offset the state would read (what its latest checkpoint holds).
    state_offset: int
    #: The partition's latest offset (the offset of the next record written).
    latest_offset: int

    @property
    def records(self) -> int:
        """Records written after what the state holds (0 when it holds everything)."""
        return max(0, self.latest_offset - self.state_offset)


def input_lag(checkpoint: CompletedCheckpoint | None, admin: AdminClient,
              timeout_s: float) -> list[PartitionLag]:
    """The lag of every Kafka input partition ``checkpoint`` records (sorted by topic and
    partition; empty without a checkpoint or without Kafka input). Partitions the state
    never read (added to the topic since) are not counted: the query starts them where
    its ``startingOffsets`` say."""
    if checkpoint is None:
        return []
    where = f"checkpoint {checkpoint.checkpoint_id} of application {checkpoint.application!r}"
    recorded = recorded_source_offsets(checkpoint.properties, where) or {}
    lags: list[PartitionLag] = []
    for topic, offsets in sorted(recorded.items()):
        partitions = max(offsets) + 1
        latest = list_offsets(admin, topic, partitions, OffsetSpec.latest(), timeout_s)
        lags.extend(PartitionLag(topic, partition, offset, latest[partition])
                    for partition, offset in sorted(offsets.items()))
    return lags


class InputLagCollector:
    """A Prometheus collector of ``kafka_changelog_input_lag_records`` for one
    application and operator, measured at every scrape (:func:`input_lag` of the latest
    checkpoint ``latest_checkpoint`` returns). A scrape that cannot measure it (a broker
    unreachable) logs a warning and shows no lag samples, rather than failing the scrape
    of every other metric."""

    NAME = "kafka_changelog_input_lag_records"

    def __init__(self, application: str, operator: str,
                 latest_checkpoint: Callable[[], CompletedCheckpoint | None],
                 input_kafka: Mapping[str, Any], timeout_s: float = 10.0) -> None:
        self.application = application
        self.operator = operator
        self._latest_checkpoint = latest_checkpoint
        self._input_kafka = dict(input_kafka)
        self.timeout_s = timeout_s

    def collect(self) -> Iterator[Any]:
        """The gauge family (``prometheus_client``'s collector protocol)."""
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            self.NAME, "Records of each Kafka input partition after the offsets the "
            "state's latest checkpoint holds.",
            labels=["application", "operator", "topic", "partition"])
        try:
            admin = new_admin(self._input_kafka, f"input lag of {self.application}")
            lags = input_lag(self._latest_checkpoint(), admin, self.timeout_s)
        except Exception as exc:  # a scrape shows the other metrics whatever happens here
            logger.warning("application %s: cannot measure the input lag: %s",
                           self.application, exc)
            lags = []
        for lag in lags:
            family.add_metric([self.application, self.operator, lag.topic,
                               str(lag.partition)], lag.records)
        yield family

    def describe(self) -> list[Any]:
        """Nothing at registration (no Kafka call when the collector is registered)."""
        return []


__all__ = ["InputLagCollector", "PartitionLag", "input_lag"]
