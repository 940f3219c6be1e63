"""The internal columns a stateful batch adds to its rows and its tasks' results.

The driver adds each row's state key, key group and subtask; each task returns its
subtask's state handle (on one row of its own), its Spark partition and its metrics.
"""

from __future__ import annotations

from .subtask_partitioning import SLOT_COLUMN

#: The row's state key bytes (``kafka_changelog.keys``, computed by Spark SQL).
KEY_COLUMN = "__kc_key"
#: ``pmod(hash(key), max_parallelism)``.
KEY_GROUP_COLUMN = "__kc_key_group"
#: The subtask owning the key group.
SUBTASK_COLUMN = "__kc_subtask"
#: The ``SubtaskState`` bytes of the task's snapshot (null on output rows).
HANDLE_COLUMN = "__kc_handle"
#: The Spark partition that ran the subtask.
PARTITION_COLUMN = "__kc_partition"
#: The subtask's ``SubtaskMetrics`` as JSON (handle row only).
METRICS_COLUMN = "__kc_metrics"
#: True on the placement's marker rows (never reach a task: see the driver).
MARKER_COLUMN = "__kc_marker"
#: What the driver adds to the input rows (the slot keeps the rows' partitioning up to
#: the task: see ``partition_by_subtask``).
INPUT_COLUMNS = (SUBTASK_COLUMN, KEY_COLUMN, KEY_GROUP_COLUMN, SLOT_COLUMN)
#: What a task adds to its results, in order.
RESULT_COLUMNS = (SUBTASK_COLUMN, PARTITION_COLUMN, METRICS_COLUMN, HANDLE_COLUMN)
#: ``RESULT_COLUMNS`` as a Spark DDL schema.
RESULT_SCHEMA = (f"{SUBTASK_COLUMN} int, {PARTITION_COLUMN} int, {METRICS_COLUMN} string, "
                 f"{HANDLE_COLUMN} binary")
