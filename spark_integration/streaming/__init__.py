"""Exactly-once keyed state for Structured Streaming, through ``foreachBatch``: running a query.

One module per role. The batch, on the driver: :mod:`.driver` (the ``foreachBatch``
function: plans a batch, runs a task per subtask, commits the checkpoint),
:mod:`.driver_hold` (the driver's claim on its application), :mod:`.batch_identity`
(which checkpoint a batch commits and starts from), :mod:`.batch_time` (the batch's
processing time and watermark), :mod:`.batch_input` and :mod:`.input_check` (a batch's
input against the input its state holds), :mod:`.subtask_partitioning` and
:mod:`.subtask_hosts` (one Spark partition per subtask, on the host that holds its
store), :mod:`.query_stop`, :mod:`.ticks` (micro-batches without new input). The task, on
the workers: :mod:`.task` (what a Spark task runs for its subtask), :mod:`.task_time`
(late rows and due timers), :mod:`.key_runs` and :mod:`.key_rows` (a subtask's rows cut
per key), :mod:`.key_state` (what the user's function gets), :mod:`.vectorized` (the
vectorised entry point), :mod:`.output_rows` and :mod:`.kafka_sink` (outputs, exactly
once), :mod:`.worker_resources` and :mod:`.worker_release` (what a Python process keeps
across batches). Both sides: :mod:`.config` (:class:`StreamingStateConfig`),
:mod:`.state_declarations`, :mod:`.events` (what listeners hear), :mod:`.metrics` (what
a batch reports), :mod:`.columns` (the internal columns). Around a query:
:mod:`.tester` (running a function in plain Python), :mod:`.rewind_offsets` (where
Spark's Kafka source continues a checkpoint's state), :mod:`.initial_state` (a new
application's state from a DataFrame, in its first batch).

Streaming never imports :mod:`spark_integration.reader` and is never imported by it. Both
may use :mod:`spark_integration.sessions` and the contracts at the top of the package
that the state's writer and its reader share: :mod:`spark_integration.keys` (key bytes
as Spark SQL) and :mod:`spark_integration.checkpoint_properties` (what a batch records
in its checkpoint). The public names are here; :mod:`spark_integration` exports the
most used of them.
"""

from typing import TYPE_CHECKING

from kafka_changelog.lazy_exports import install as _install_lazy_exports

# The public names, imported from their modules when first read (a Python worker that
# unpickles a task imports task.py and what it uses, not the driver's modules).
if TYPE_CHECKING:
    from .batch_time import EventTimeColumnError
    from .config import StreamingStateConfig
    from .driver import StatefulProcessor, stateful_foreach_batch
    from .events import (
        BATCH_EVENTS,
        TASK_EVENTS,
        BatchEvent,
        BatchListener,
        TaskEvent,
        TaskListener,
    )
    from .initial_state import InitialStateError, InitialStateFunction
    from .input_check import InputOffsetsError
    from .key_state import (
        BatchContext,
        EventTime,
        EventTimeNotDeclaredError,
        KeyState,
        KeyTimers,
        LateRows,
        TimerInfo,
        TimerOutsideCallError,
    )
    from .metrics import BatchReport
    from .task import StatefulFunction
    from .task_time import TimerFunction
    from .tester import StatefulTester
    from .ticks import TICK_COLUMN, with_ticks
    from .vectorized import BatchState, BulkTimers, VectorizedFunction, VectorizedTimerFunction

__all__ = [
    "BATCH_EVENTS",
    "TASK_EVENTS",
    "TICK_COLUMN",
    "BatchContext",
    "BatchEvent",
    "BatchListener",
    "BatchReport",
    "BatchState",
    "BulkTimers",
    "EventTime",
    "EventTimeColumnError",
    "EventTimeNotDeclaredError",
    "InitialStateError",
    "InitialStateFunction",
    "InputOffsetsError",
    "KeyState",
    "KeyTimers",
    "LateRows",
    "StatefulFunction",
    "StatefulProcessor",
    "StatefulTester",
    "StreamingStateConfig",
    "TaskEvent",
    "TaskListener",
    "TimerFunction",
    "TimerInfo",
    "TimerOutsideCallError",
    "VectorizedFunction",
    "VectorizedTimerFunction",
    "stateful_foreach_batch",
    "with_ticks",
]

_install_lazy_exports(globals())
