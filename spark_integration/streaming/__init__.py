"""Exactly-once keyed state for Structured Streaming, through ``foreachBatch``.

One module per role: :mod:`.driver` (the ``foreachBatch`` function: plans a batch, runs
a task per subtask, commits the checkpoint), :mod:`.batch_time` (the batch's processing
time and watermark), :mod:`.task` (what a Spark task runs for its subtask),
:mod:`.task_time` (late rows and due timers in a task), :mod:`.key_state` (what the
user's function gets), :mod:`.vectorized` (the vectorised entry point),
:mod:`.worker_resources` (what a Python process keeps across batches), :mod:`.batch_input`
and :mod:`.input_check` (a batch's input against the input its state holds), :mod:`.events`
(what listeners hear), :mod:`.columns` (the internal columns), :mod:`.tester` (running a
function in plain Python), :mod:`.ticks` (micro-batches without new input). The public
names are here.
"""

from ..metrics import BatchReport
from ..streaming_config import StreamingStateConfig
from .batch_time import EventTimeColumnError
from .driver import StatefulProcessor, stateful_foreach_batch
from .events import (
    BATCH_EVENTS,
    TASK_EVENTS,
    BatchEvent,
    BatchListener,
    TaskEvent,
    TaskListener,
)
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
