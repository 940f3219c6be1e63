"""PySpark integration of kafka-changelog (imports pyspark; the core package never does).

The names a streaming application needs: exactly-once keyed state through
``foreachBatch``, exactly-once Kafka outputs, the ``kafka-changelog`` reader, sessions
with Spark's Kafka connector, and per-batch state metrics.

One package per role: :mod:`.reader` (reading a checkpoint's state and changes:
``format("kafka-changelog")`` and the change feed), :mod:`.streaming` (running a
stateful query) and :mod:`.sessions` (reaching Spark and Kafka), which both others use.
The reader and streaming never import each other. What both of them hold to is here at
the top, beside the public names: :mod:`.keys` (the key encoding as Spark SQL, the twin
of :mod:`kafka_changelog.keys`) and :mod:`.checkpoint_properties` (what a batch records in
the checkpoint it commits). Neither is a step of reading nor of running, and each imports
no package of this one.
"""

import ast
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The public names, listed once: type checkers read these imports; at run time
# _homes() reads them from this file and __getattr__ imports each name's module on first
# use, because the reader's worker-side modules (planning, scan, rows) import this
# package without pyspark, and must stay that way.
if TYPE_CHECKING:
    from .reader.datasource import KafkaChangelogDataSource as KafkaChangelogDataSource
    from .sessions.connect import connect_session as connect_session
    from .sessions.session import local_session as local_session
    from .sessions.session import spark_session as spark_session
    from .sessions.spark_versions import SparkFeature as SparkFeature
    from .sessions.spark_versions import (
        UnsupportedSparkVersionError as UnsupportedSparkVersionError,
    )
    from .streaming import BATCH_EVENTS as BATCH_EVENTS
    from .streaming import BatchContext as BatchContext
    from .streaming import BatchListener as BatchListener
    from .streaming import BatchReport as BatchReport
    from .streaming import EventTime as EventTime
    from .streaming import InputOffsetsError as InputOffsetsError
    from .streaming import KeyState as KeyState
    from .streaming import LateRows as LateRows
    from .streaming import StatefulProcessor as StatefulProcessor
    from .streaming import StatefulTester as StatefulTester
    from .streaming import StreamingStateConfig as StreamingStateConfig
    from .streaming import TimerInfo as TimerInfo
    from .streaming import stateful_foreach_batch as stateful_foreach_batch
    from .streaming import with_ticks as with_ticks
    from .streaming.batch_identity import BatchOrderError as BatchOrderError
    from .streaming.batch_identity import OperatorMismatchError as OperatorMismatchError
    from .streaming.kafka_sink import CHECKPOINT_HEADER as CHECKPOINT_HEADER
    from .streaming.kafka_sink import KafkaOutputSink as KafkaOutputSink
    from .streaming.key_rows import KeyRows as KeyRows
    from .streaming.metrics import StateMetricsListener as StateMetricsListener
    from .streaming.metrics import SubtaskMetrics as SubtaskMetrics
    from .streaming.output_rows import OutputColumnsError as OutputColumnsError
    from .streaming.rewind_offsets import starting_offsets as starting_offsets
    from .writer.format import register as register
    from .writer.options import declared_states as declared_states


def _homes() -> dict[str, str]:
    """Each public name's module: the ``if TYPE_CHECKING:`` imports of this file."""
    # The loader gives the source also when the package is imported from a zip (Spark's
    # --py-files), where __file__ is no file.
    loader = globals().get("__loader__")
    get_source = getattr(loader, "get_source", None)
    source = get_source(__name__) if get_source is not None else None
    if source is None:
        source = Path(__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    return {alias.name: node.module for node in block.body
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names}


_HOMES = _homes()
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """The public names, imported from their modules on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{home}", __name__), name)
