"""The one producer a storage shares between all its writers.

It bounds the bytes produced but not yet acknowledged (appends block, then time
out, when the broker stops answering), polls delivery reports on its own
thread, and runs completion callbacks on another, so a writer callback waiting
for a writer lock never stalls the accounting that frees in-flight bytes.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ..errors import BackpressureTimeoutError
from .config import KafkaChangelogConfig
from .errors import delivery_error
from .record_format import EncodedRecord

#: Delivery errors that only say "the producer hit a fatal error".
_FATAL_FALLOUT = {KafkaError._FATAL, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}

#: Called once per record with (offset, None) or (None, error).
DeliveryCallback = Callable[[int | None, Exception | None], None]


class SharedProducer:
    """Idempotent ``acks=all`` producer with an in-flight byte bound."""

    def __init__(self, config: KafkaChangelogConfig) -> None:
        self._config = config
        self._producer = Producer({**config.producer(), "error_cb": self._on_client_error})
        self._cond = threading.Condition()
        self._in_flight_bytes = 0
        self._outstanding: set[int] = set()
        self._ids = itertools.count()
        self._client_errors: list[KafkaError] = []
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
                    None, delivery_error(topic, partition, error))
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
                raise delivery_error(topic, partition, exc.args[0]) from exc

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

    def take_client_errors(self) -> list[KafkaError]:
        """Errors librdkafka reported outside deliveries (e.g. authentication) since last call."""
        with self._cond:
            errors, self._client_errors = self._client_errors, []
        return errors

    def close(self, timeout: float = 30.0) -> None:
        """Wait up to ``timeout`` for outstanding deliveries, then stop the threads."""
        if self._closed.is_set():
            return
        self._producer.flush(timeout)
        self._closed.set()
        self._poller.join()
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
        with self._cond:
            old = self._producer
            self._producer = Producer(
                {**self._config.producer(), "error_cb": self._on_client_error})
            self._fatal = None
        # Fail what the broken producer still holds, serving its delivery callbacks.
        old.purge()
        old.flush(self._config.request_timeout_s)

    def _on_client_error(self, error: KafkaError) -> None:
        with self._cond:
            self._client_errors.append(error)
            if error.fatal():
                self._fatal = self._last_fatal = error

    def _poll_loop(self) -> None:
        while not self._closed.is_set():
            try:
                self._producer.poll(0.05)
            except KafkaException as exc:
                # confluent-kafka raises fatal errors from poll; record and keep serving
                # delivery reports so that waiting persists fail instead of hanging.
                error = exc.args[0]
                with self._cond:
                    self._client_errors.append(error)
                    if error.fatal():
                        self._fatal = self._last_fatal = error

    def __repr__(self) -> str:
        return f"SharedProducer(in_flight_bytes={self.in_flight_bytes})"


