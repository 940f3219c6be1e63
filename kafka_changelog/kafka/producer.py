"""The producer wrappers: the changelog's shared producer and the stores' acked producer.

:class:`SharedProducer` is the one producer a storage shares between all its writers. It
bounds the bytes produced but not yet acknowledged (appends block, then time
out, when the broker stops answering), polls delivery reports on its own
thread, and runs completion callbacks on another, so a writer callback waiting
for a writer lock never stalls the accounting that frees in-flight bytes.
:class:`AckedProducer` writes the snapshot and checkpoint stores' records and blocks
until each one is acknowledged.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ..errors import BackpressureTimeoutError, ChangelogError
from ..state.records import OutRecord, RecordAppender
from .config import KafkaChangelogConfig
from .error_text import access_error, delivery_error, describe, is_access_error
from .live_clients import close_producer, new_producer
from .record_format import EncodedRecord

logger = logging.getLogger(__name__)

#: Delivery errors that only say "the producer hit a fatal error".
_FATAL_FALLOUT = {KafkaError._FATAL, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}

#: Called once per record with (offset, None) or (None, error).
DeliveryCallback = Callable[[int | None, Exception | None], None]


class SharedProducer:
    """Idempotent ``acks=all`` producer with an in-flight byte bound."""

    def __init__(self, config: KafkaChangelogConfig) -> None:
        self._config = config
        self._producer = new_producer({**config.producer(), "error_cb": self._on_client_error},
                                      f"changelog topic {config.topic}")
        self._cond = threading.Condition()
        self._in_flight_bytes = 0
        self._outstanding: set[int] = set()
        self._ids = itertools.count()
        # A fatal error (e.g. no permission to get an idempotent producer id) makes a
        # librdkafka producer unusable: the next produce replaces it.
        self._fatal: KafkaError | None = None
        self._last_fatal: KafkaError | None = None
        self._closed = threading.Event()
        self._completions = ThreadPoolExecutor(1, thread_name_prefix="kafka-changelog-complete")
        self._poller = threading.Thread(
            target=self._poll_loop, name="kafka-changelog-poll", daemon=True
        )
        self._poller.start()

    @property
    def in_flight_bytes(self) -> int:
        """Bytes produced and not yet acknowledged (or failed)."""
        with self._cond:
            return self._in_flight_bytes

    def produce(
        self, topic: str, partition: int, record: EncodedRecord, on_done: DeliveryCallback
    ) -> None:
        """Produce ``record``; blocks while the in-flight bound is reached.

        Raises :class:`BackpressureTimeoutError` after ``append_timeout_s``.
        """
        size = len(record.value)
        record_id = self._reserve(size, topic)

        def delivered(error: KafkaError | None, message: Message) -> None:
            self._release(record_id, size)
            if error is not None and error.code() in _FATAL_FALLOUT and self._last_fatal:
                error = self._last_fatal  # name the real cause, not "fatal" or "purged"
            if error is not None:
                outcome: tuple[int | None, Exception | None] = (
                    None, delivery_error(topic, partition, error, self._config.producer()))
            else:
                outcome = (message.offset(), None)
            self._completions.submit(on_done, *outcome)

        if self._fatal is not None:
            self._replace_producer()
        while True:
            try:
                self._producer.produce(
                    topic, value=record.value, key=record.key, partition=partition,
                    headers=list(record.headers), on_delivery=delivered,
                )
                return
            except BufferError:
                # librdkafka's own queue is full: let deliveries drain it.
                self._producer.poll(0.05)
            except KafkaException as exc:
                self._release(record_id, size)
                raise delivery_error(topic, partition, exc.args[0],
                                     self._config.producer()) from exc

    def wait_for_records_before_now(self, timeout: float) -> bool:
        """Wait until every record produced before this call is acknowledged and its
        completion callbacks ran; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            mark = next(self._ids)
            while any(record_id < mark for record_id in self._outstanding):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        self._completions.submit(lambda: None).result(timeout=max(0.0, deadline - time.monotonic()))
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Wait up to ``timeout`` for outstanding deliveries, fail what is left, close the
        producer and stop the threads (returns within about ``timeout``)."""
        if self._closed.is_set():
            return
        with contextlib.suppress(KafkaException):  # a fatal error: nothing to deliver
            self._producer.flush(timeout)
        self._closed.set()
        self._poller.join()
        close_producer(self._producer)  # its purged records' callbacks still complete
        self._completions.shutdown(wait=True)

    def _reserve(self, size: int, topic: str) -> int:
        limit = self._config.max_in_flight_bytes
        deadline = time.monotonic() + self._config.append_timeout_s
        with self._cond:
            # A record larger than the whole bound still goes out alone.
            while self._in_flight_bytes and self._in_flight_bytes + size > limit:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BackpressureTimeoutError(
                        f"{self._in_flight_bytes} bytes to {topic} are unacknowledged "
                        f"(max_in_flight_bytes={limit}) after waiting "
                        f"{self._config.append_timeout_s:.0f} s: is the broker reachable?"
                    )
                self._cond.wait(remaining)
            self._in_flight_bytes += size
            record_id = next(self._ids)
            self._outstanding.add(record_id)
            return record_id

    def _release(self, record_id: int, size: int) -> None:
        with self._cond:
            self._in_flight_bytes -= size
            self._outstanding.discard(record_id)
            self._cond.notify_all()

    def _replace_producer(self) -> None:
        logger.warning("the changelog producer had a fatal error (%s); replaced by a new one",
                       self._fatal)
        with self._cond:
            old = self._producer
            self._producer = new_producer(
                {**self._config.producer(), "error_cb": self._on_client_error},
                f"changelog topic {self._config.topic}")
            self._fatal = None
        # Fail what the broken producer still holds, serving its delivery callbacks.
        old.purge()
        old.flush(self._config.request_timeout_s)
        close_producer(old)

    def _on_client_error(self, error: KafkaError) -> None:
        # Only a fatal error matters here (the next produce replaces the producer); the
        # others librdkafka retries by itself, and failed deliveries report their outcome.
        if error.fatal():
            with self._cond:
                self._fatal = self._last_fatal = error

    def _poll_loop(self) -> None:
        while not self._closed.is_set():
            try:
                self._producer.poll(0.05)
            except KafkaException as exc:
                # confluent-kafka raises fatal errors from poll; record and keep serving
                # delivery reports so that waiting persists fail instead of hanging.
                self._on_client_error(exc.args[0])

    def __repr__(self) -> str:
        return f"SharedProducer(in_flight_bytes={self.in_flight_bytes})"


class AckedProducer:
    """An idempotent ``acks=all`` producer whose :meth:`produce_all` blocks until acknowledged.

    Safe to share between threads: each call waits for its own records only.
    ``error_type`` is raised (naming topic, partition and ``what``) when a record fails.
    """

    def __init__(
        self,
        settings: dict[str, Any],
        topic: str,
        error_type: Callable[[str], ChangelogError],
        timeout_s: float,
    ) -> None:
        self._settings = {**settings, "acks": "all", "enable.idempotence": True}
        self._topic = topic
        self._error_type = error_type
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._fatal: KafkaError | None = None
        self._producer: Producer | None = self._new_producer()

    def _new_producer(self) -> Producer:
        return new_producer({**self._settings, "error_cb": self._on_error},
                            f"records to {self._topic}")

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._fatal = error

    def produce_all(self, records: Sequence[OutRecord], what: str) -> list[int]:
        """Produce ``records`` and wait until every one is acknowledged; their offsets.

        ``what`` names the records in errors ("snapshot chunks of backend b").
        """
        session = self.session(what)
        for record in records:
            session.produce(record)
        return session.finish()

    def session(self, what: str, max_unacked_bytes: int | None = None) -> ProduceSession:
        """A series of records produced as they come, acknowledged together by
        :meth:`ProduceSession.finish`. With ``max_unacked_bytes``, producing waits while
        more value bytes than that are unacknowledged, which bounds what the producer
        holds for a caller that makes records faster than the broker takes them."""
        with self._lock:
            if self._producer is None:
                raise self._error_type(f"cannot produce {what} to {self._topic}: closed")
            if self._fatal is not None:
                # A fatal error (e.g. an idempotence sequence error) ends a producer's life.
                self._producer, self._fatal = self._new_producer(), None
            producer = self._producer
        return ProduceSession(self, producer, what, max_unacked_bytes)

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout_s + float(
            self._settings.get("delivery.timeout.ms", 300_000)) / 1000

    def _poll(self, producer: Producer, timeout_s: float, partition: int, what: str) -> None:
        # A fatal error (e.g. no ACL for an idempotent producer id) surfaces from poll as a
        # KafkaException: name it like a failed delivery, never let it escape raw.
        try:
            producer.poll(timeout_s)
        except KafkaException as exc:
            raise self._failure(partition, what, exc.args[0]) from exc

    def _failure(self, partition: int, what: str, error: KafkaError) -> ChangelogError:
        message = f"producing {what} to {self._topic}[{partition}] failed: {describe(error)}"
        if is_access_error(error):
            return access_error(error, f"producing {what} to {self._topic}[{partition}]",
                                self._settings, operation="WRITE", resource=self._topic)
        return self._error_type(message)

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait up to ``timeout_s`` for anything still queued, then drop the producer."""
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            # A producer a fatal error ended has nothing left to deliver.
            close_producer(producer, timeout_s)


class ProduceSession(RecordAppender):
    """Records of one :meth:`AckedProducer.session`: produced as they come, offsets in
    order once :meth:`finish` saw every one acknowledged."""

    def __init__(self, owner: AckedProducer, producer: Producer, what: str,
                 max_unacked_bytes: int | None) -> None:
        self._owner = owner
        self._producer = producer
        self._what = what
        self._limit = max_unacked_bytes
        self._offsets: list[int | None] = []
        self._partitions: list[int] = []
        self._failures: list[tuple[int, KafkaError]] = []
        self._done = threading.Semaphore(0)
        self._acknowledged = 0
        self._unacked_bytes = 0
        self._lock = threading.Lock()

    def produce(self, record: OutRecord) -> None:
        """Produce ``record`` (waits first while too many bytes are unacknowledged)."""
        owner = self._owner
        if self._limit is not None:
            deadline = owner._deadline()
            while self._unacked_bytes > self._limit:
                if time.monotonic() > deadline:
                    raise self._stalled()
                owner._poll(self._producer, 0.05, record.partition, self._what)
                self._collect()
        index = len(self._offsets)
        self._offsets.append(None)
        self._partitions.append(record.partition)
        size = len(record.value or b"")
        with self._lock:
            self._unacked_bytes += size

        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                self._failures.append((index, error))
            else:
                self._offsets[index] = message.offset()
            with self._lock:
                self._unacked_bytes -= size
            self._done.release()

        headers: list[tuple[str, str | bytes | None]] = list(record.headers)
        while True:
            try:
                self._producer.produce(
                    owner._topic, value=record.value, key=record.key,
                    partition=record.partition, headers=headers, on_delivery=delivered)
                break
            except BufferError:
                self._producer.poll(0.05)  # librdkafka's queue is full: let deliveries drain
            except KafkaException as exc:
                raise owner._failure(record.partition, self._what, exc.args[0]) from exc
        owner._poll(self._producer, 0, record.partition, self._what)

    def _collect(self) -> None:
        while self._done.acquire(blocking=False):
            self._acknowledged += 1

    def _stalled(self) -> ChangelogError:
        total = len(self._offsets)
        return self._owner._error_type(
            f"{total - self._acknowledged} of {total} {self._what} to {self._owner._topic} "
            "were neither acknowledged nor failed in time: is the broker reachable?")

    def finish(self) -> list[int]:
        """Wait until every record is acknowledged; their offsets, in produce order.
        Raises (naming topic, partition and what) when one failed."""
        owner = self._owner
        deadline = owner._deadline()
        total = len(self._offsets)
        while True:
            self._collect()
            if self._acknowledged >= total:
                break
            if time.monotonic() > deadline:
                raise self._stalled()
            owner._poll(self._producer, 0.05, self._partitions[0], self._what)
        if self._failures:
            index, error = min(self._failures, key=lambda f: f[0])
            raise owner._failure(self._partitions[index], self._what, error)
        return [o for o in self._offsets if o is not None]
