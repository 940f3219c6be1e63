"""PySpark integration of kafka-changelog (imports pyspark; the core package never does).

The names a streaming application needs: exactly-once keyed state through
``foreachBatch``, exactly-once Kafka outputs, the ``kafka-changelog`` reader, sessions
with Spark's Kafka connector, and per-batch state metrics.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ loads them
    from .batch_identity import BatchOrderError, OperatorMismatchError
    from .datasource import KafkaChangelogDataSource, register
    from .kafka_sink import KafkaOutputSink
    from .key_rows import KeyRows
    from .metrics import StateMetricsListener, SubtaskMetrics
    from .output_rows import OutputColumnsError
    from .session import local_session, spark_session
    from .streaming import (
        BATCH_EVENTS,
        BatchListener,
        BatchReport,
        KeyState,
        StatefulProcessor,
        StreamingStateConfig,
        stateful_foreach_batch,
    )

# Where each public name lives. Loaded on first use: the reader's worker-side modules
# (planning, scan, rows) import this package without pyspark, and must stay that way.
_HOMES = {
    "BatchOrderError": "batch_identity",
    "OperatorMismatchError": "batch_identity",
    "KafkaChangelogDataSource": "datasource",
    "register": "datasource",
    "KafkaOutputSink": "kafka_sink",
    "KeyRows": "key_rows",
    "StateMetricsListener": "metrics",
    "SubtaskMetrics": "metrics",
    "OutputColumnsError": "output_rows",
    "local_session": "session",
    "spark_session": "session",
    "BATCH_EVENTS": "streaming",
    "BatchListener": "streaming",
    "BatchReport": "streaming",
    "KeyState": "streaming",
    "StatefulProcessor": "streaming",
    "StreamingStateConfig": "streaming",
    "stateful_foreach_batch": "streaming",
}


def __getattr__(name: str) -> Any:
    """The public names, imported from their modules on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{home}", __name__), name)


__all__ = [
    "BATCH_EVENTS",
    "BatchListener",
    "BatchOrderError",
    "BatchReport",
    "KafkaChangelogDataSource",
    "KafkaOutputSink",
    "KeyRows",
    "KeyState",
    "OperatorMismatchError",
    "OutputColumnsError",
    "StateMetricsListener",
    "StatefulProcessor",
    "StreamingStateConfig",
    "SubtaskMetrics",
    "local_session",
    "register",
    "spark_session",
    "stateful_foreach_batch",
]
