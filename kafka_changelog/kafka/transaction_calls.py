"""Producer calls inside a Kafka transaction that wait out transient conditions.

Shared by the driver's transactional checkpoint commit, its lease and the tasks' subtask
commits: ``produce`` on a full local queue, and ``init_transactions`` or
``commit_transaction`` on a retriable error (a timeout of a broker slow under load:
librdkafka's "retry call to resume"), mean "not yet", never "failed". The two calls are
made again, each attempt waiting up to the request timeout, until the connection's
``retry_bound_s`` (:data:`DEFAULT_RETRY_BOUND_S` unless configured) has passed since
the first; then :class:`TransactionCallTimeoutError` names the call, the transactional
id, the attempts and how long they waited.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from ..errors import KafkaAccessError
from ..state.errors import CheckpointStoreError
from .error_text import access_error, describe, is_access_error
from .live_clients import close_producer

#: Seconds a transactional call answered with a retriable error is made again, from its
#: first attempt (the connection's ``retry_bound_s`` overrides it).
DEFAULT_RETRY_BOUND_S = 120.0

#: Defaults of every transactional producer (its client and producer settings override them).
#: With sparse connections (librdkafka's default) a new producer drops its bootstrap
#: connection once it learns the brokers and connects to one only on demand:
#: ``init_transactions`` then often finds no broker up to ask for its coordinator and
#: waits for librdkafka's fixed 500 ms retry timer. Connected to every broker at once, it
#: asks as soon as one is up (~10 ms instead of 60 to 550 ms, on every driver start and
#: in every task's first batch). A transactional producer writes to the checkpoint topic
#: and the outputs' partitions, so it needs most brokers anyway.
TRANSACTIONAL_PRODUCER_DEFAULTS: dict[str, Any] = {"enable.sparse.connections": False}


class TransactionAbortedError(CheckpointStoreError):
    """The transaction was aborted: neither the checkpoint nor its outputs are visible."""


class TransactionFencedError(CheckpointStoreError):
    """Another producer with the same transactional id took over; this one is finished."""


class TransactionCallTimeoutError(CheckpointStoreError):
    """A transactional call kept failing with retriable errors (timeouts) beyond its bound:
    the message names the call, the transactional id, the attempts and the wait."""


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


def retry_transaction_call(call: str, attempt: Callable[[float], None],
                           transactional_id: str, timeout_s: float, bound_s: float) -> int:
    """Run ``attempt(timeout)`` (a producer's ``call``, e.g. ``init_transactions``) until it
    returns; the number of retries it took (0: the first attempt returned). A retriable
    :class:`KafkaException` (the outcome is still pending, and calling again is how
    librdkafka resumes it) is retried, each attempt waiting up to ``timeout_s`` and none
    starting once ``bound_s`` has passed since the first; then
    :class:`TransactionCallTimeoutError`. Other errors are raised as they are."""
    started = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        remaining = bound_s - (time.monotonic() - started)
        try:
            attempt(max(1.0, min(timeout_s, remaining)))
            return attempts - 1
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not error.retriable():
                raise
            waited = time.monotonic() - started
            if waited >= bound_s:
                raise TransactionCallTimeoutError(
                    f"{call} with transactional id {transactional_id!r} still failing after "
                    f"{attempts} attempts in {waited:.1f} s (bound {bound_s:g} s; each attempt "
                    f"up to {timeout_s:g} s): {describe(error)}") from exc
            time.sleep(min(0.2, max(0.0, bound_s - waited)))


def init_transactions_retrying(producer: Producer, transactional_id: str, timeout_s: float,
                               bound_s: float = DEFAULT_RETRY_BOUND_S) -> int:
    """``init_transactions`` retried as :func:`retry_transaction_call` says (it fences
    earlier producers of the id and aborts their open transaction); the retries."""
    return retry_transaction_call("init_transactions", producer.init_transactions,
                                  transactional_id, timeout_s, bound_s)


def commit_transaction_retrying(producer: Producer, timeout_s: float,
                                transactional_id: str = "-",
                                bound_s: float = DEFAULT_RETRY_BOUND_S) -> int:
    """Commit the open transaction, retried as :func:`retry_transaction_call` says; the
    retries."""
    return retry_transaction_call("commit_transaction", producer.commit_transaction,
                                  transactional_id, timeout_s, bound_s)


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
    """Flush ``producer`` for the last time (up to ``timeout_s``) and close it
    (:func:`~kafka_changelog.kafka.live_clients.close_producer`). A fenced producer is in
    a fatal state and librdkafka raises that error from ``flush`` (sometimes): it has
    nothing left to deliver and whoever lets it go moves on (the error was reported where
    it struck)."""
    close_producer(producer, timeout_s)
