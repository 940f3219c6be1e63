"""PySpark integration of kafka-changelog (imports pyspark; the core package never does).

The names a streaming application needs: exactly-once keyed state through
``foreachBatch``, exactly-once Kafka outputs, the ``kafka-changelog`` reader, sessions
with Spark's Kafka connector, and per-batch state metrics.
"""

from .batch_identity import BatchOrderError
from .datasource import KafkaChangelogDataSource, register
from .kafka_sink import KafkaOutputSink
from .metrics import StateMetricsListener, SubtaskMetrics
from .session import local_session, spark_session
from .streaming import (
    BATCH_EVENTS,
    BatchListener,
    BatchReport,
    KeyState,
    StatefulProcessor,
    StreamingStateConfig,
    StringKey,
    stateful_foreach_batch,
)

__all__ = [
    "BATCH_EVENTS",
    "BatchListener",
    "BatchOrderError",
    "BatchReport",
    "KafkaChangelogDataSource",
    "KafkaOutputSink",
    "KeyState",
    "StateMetricsListener",
    "StatefulProcessor",
    "StreamingStateConfig",
    "StringKey",
    "SubtaskMetrics",
    "local_session",
    "register",
    "spark_session",
    "stateful_foreach_batch",
]
