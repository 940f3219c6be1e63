"""The points of a micro-batch and of its tasks that listeners hear about."""

from __future__ import annotations

from collections.abc import Callable

from kafka_changelog.enums import StrEnum


class BatchEvent(StrEnum):
    """The points of a micro-batch a :data:`BatchListener` hears about, in order (a
    ``str``: a listener may compare with the value)."""

    BATCH_START = "batch_start"
    #: Every subtask finished (with a ``KafkaOutputSink``: committed its outputs); the
    #: checkpoint record is not yet written.
    BEFORE_COMMIT = "before_commit"
    AFTER_COMMIT = "after_commit"


class TaskEvent(StrEnum):
    """The points of a subtask's task a :data:`TaskListener` hears about, in order."""

    SUBTASK_START = "subtask_start"
    #: With a ``KafkaOutputSink``: the outputs and the subtask's part of the checkpoint
    #: are produced, the transaction is not yet committed.
    SUBTASK_IN_TRANSACTION = "subtask_in_transaction"
    #: With a ``KafkaOutputSink``: the transaction is committed.
    SUBTASK_COMMITTED = "subtask_committed"


#: The batch events' names, in order.
BATCH_EVENTS = tuple(e.value for e in BatchEvent)
#: The task events' names, in order.
TASK_EVENTS = tuple(e.value for e in TaskEvent)

#: ``listener(event, batch_id)``: called on the driver at each :class:`BatchEvent`. For
#: metrics, logging, and fault injection in tests; an exception it raises fails the batch.
BatchListener = Callable[[BatchEvent, int], None]

#: ``task_listener(event, batch_id, subtask)``: called in the Spark task at each
#: :class:`TaskEvent` (pickled to the executors). An exception it raises fails the task.
TaskListener = Callable[[TaskEvent, int, int], None]

__all__ = ["BATCH_EVENTS", "TASK_EVENTS", "BatchEvent", "BatchListener", "TaskEvent",
           "TaskListener"]
