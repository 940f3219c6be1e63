"""Producer calls inside a Kafka transaction that wait out transient conditions.

Shared by the driver's transactional checkpoint commit and the tasks' subtask commits:
``produce`` on a full local queue and ``commit_transaction`` on a retriable error both
mean "not yet", never "failed".
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from ..errors import KafkaAccessError
from ..state.errors import CheckpointStoreError
from .error_text import access_error, describe, is_access_error


class TransactionAbortedError(CheckpointStoreError):
    """The transaction was aborted: neither the checkpoint nor its outputs are visible."""


class TransactionFencedError(CheckpointStoreError):
    """Another producer with the same transactional id took over; this one is finished."""


def produce_waiting(producer: Producer, topic: str, value: bytes | None, key: bytes | None,
                    partition: int | None, headers: list[tuple[str, bytes]]) -> None:
    """Produce one record; while the producer's local queue is full, serve deliveries so
    that it drains, then try again."""
    kwargs: dict[str, Any] = {"value": value, "key": key, "headers": headers}
    if partition is not None:
        kwargs["partition"] = partition
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


def commit_transaction_retrying(producer: Producer, timeout_s: float) -> None:
    """Commit the open transaction. A retriable error (a timeout, say) leaves the outcome
    pending, and calling commit again is how librdkafka finishes it: retry until
    ``timeout_s`` has passed, then raise the last error."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            producer.commit_transaction(timeout_s)
            return
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not error.retriable() or time.monotonic() > deadline:
                raise


#: Errors after which a transactional producer is unusable: fenced by another one with the
#: same transactional id, or fatal (a call on a producer whose fatal error librdkafka saw in
#: the background, e.g. its fencing, fails with ``_FATAL``, which ``fatal()`` may not flag).
_FENCED = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
           KafkaError._FATAL)


def producer_fenced(error: KafkaError) -> bool:
    """Whether ``error`` leaves the transactional producer unusable (see :data:`_FENCED`):
    its owner drops it, and a new one fails clearly if the cause remains (a missing ACL)."""
    return error.code() in _FENCED or error.fatal()


def transaction_error(doing: str, error: KafkaError, transactional_id: str,
                      successor: str = "another attempt"
                      ) -> CheckpointStoreError | KafkaAccessError:
    """The error of a transactional call that failed: a :class:`KafkaAccessError` when an
    ACL refused it, :class:`TransactionFencedError` when the producer is unusable (saying
    that ``successor`` with this transactional id took over), else a
    :class:`CheckpointStoreError`; each names ``doing`` and the transactional id."""
    what = f"{doing} with transactional id {transactional_id!r}"
    if is_access_error(error):
        return access_error(error, what, {"transactional.id": transactional_id})
    message = f"{what} failed: {describe(error)}"
    if producer_fenced(error):
        return TransactionFencedError(
            f"{message}; {successor} with this transactional id took over")
    return CheckpointStoreError(message)


def let_go(producer: Producer, timeout_s: float = 0) -> None:
    """Flush ``producer`` for the last time. A fenced producer is in a fatal state and
    librdkafka raises that error from ``flush`` (sometimes): it has nothing left to
    deliver and whoever lets it go moves on (the error was reported where it struck)."""
    with contextlib.suppress(KafkaException):
        producer.flush(timeout_s)
