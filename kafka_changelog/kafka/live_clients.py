"""The Kafka clients the library opened in this process and has not closed yet.

Every producer, consumer and admin client of the library is made here
(:func:`new_producer`, :func:`new_consumer`, :func:`new_admin`) and registered until it
is closed (a producer or consumer) or dropped (an admin client, which librdkafka
destroys when Python frees it). :func:`live_clients` lists them: a diagnostic of what
still runs in this process (each live client has librdkafka threads connecting to its
brokers), and how a test checks that a stop left nothing running.

:func:`close_producer` closes a producer within a bound: librdkafka's own ``close``
waits without limit for undelivered records, so what is left after ``timeout_s`` is
purged first (those records fail; their senders were told by their delivery callback
or gave up already).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient


class ClientKind(Enum):
    """Which kind of librdkafka client."""

    PRODUCER = "producer"
    CONSUMER = "consumer"
    ADMIN = "admin"


@dataclass(frozen=True)
class LiveClient:
    """One client of the library still open in this process."""

    #: Its number in this process (in the order the library opened them).
    number: int
    kind: ClientKind
    #: What the library opened it for ("checkpoint store of topic T").
    purpose: str
    #: When it was opened (``time.time()``).
    opened_at: float
    #: The thread that opened it.
    thread: str


_lock = threading.Lock()
_numbers = itertools.count(1)
_live: dict[int, LiveClient] = {}


def _register(client: Any, kind: ClientKind, purpose: str) -> None:
    number = next(_numbers)
    with _lock:
        _live[number] = LiveClient(number, kind, purpose, time.time(),
                                   threading.current_thread().name)
    client._kc_number = number
    # Freed without close (or an admin client, which has none): no longer live.
    weakref.finalize(client, _forget, number)


def _forget(number: int) -> None:
    with _lock:
        _live.pop(number, None)


class _Producer(Producer):
    """A producer that leaves the registry when closed."""

    _kc_number: int

    def close(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().close(*args, **kwargs)
        finally:
            _forget(self._kc_number)


class _Consumer(Consumer):
    """A consumer that leaves the registry when closed."""

    _kc_number: int

    def close(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().close(*args, **kwargs)
        finally:
            _forget(self._kc_number)


class _Admin(AdminClient):
    """An admin client (it leaves the registry when freed)."""

    _kc_number: int


def new_producer(settings: Mapping[str, Any], purpose: str) -> Producer:
    """A new producer with ``settings``, registered as open for ``purpose`` until
    :func:`close_producer` (or its ``close``) closes it."""
    producer = _Producer(dict(settings))
    _register(producer, ClientKind.PRODUCER, purpose)
    return producer


def new_consumer(settings: Mapping[str, Any], purpose: str) -> Consumer:
    """A new consumer with ``settings``, registered as open for ``purpose`` until its
    ``close``."""
    consumer = _Consumer(dict(settings))
    _register(consumer, ClientKind.CONSUMER, purpose)
    return consumer


def new_admin(settings: Mapping[str, Any], purpose: str) -> AdminClient:
    """A new admin client with ``settings``, registered as open for ``purpose`` until
    Python frees it (keep no reference to it beyond its use, nor in a cycle)."""
    admin = _Admin(dict(settings))
    _register(admin, ClientKind.ADMIN, purpose)
    return admin


def close_producer(producer: Producer, timeout_s: float = 0) -> None:
    """Deliver what ``producer`` still holds for up to ``timeout_s``, purge the rest, and
    close it: returns within about ``timeout_s``, with its librdkafka threads gone.
    Idempotent; a producer in a fatal state (fenced) raises nothing here."""
    with contextlib.suppress(KafkaException, RuntimeError):  # fatal, or closed already
        producer.flush(max(0.0, timeout_s))
    with contextlib.suppress(KafkaException, RuntimeError):
        producer.purge()
        producer.flush(0)
    with contextlib.suppress(KafkaException, RuntimeError), warnings.catch_warnings():
        # A transactional producer whose init_transactions was cut short warns that it
        # cannot abort: there is nothing to abort.
        warnings.simplefilter("ignore", RuntimeWarning)
        producer.close()


def live_clients() -> list[LiveClient]:
    """The library's clients open in this process now, oldest first."""
    with _lock:
        return sorted(_live.values(), key=lambda c: c.number)


__all__ = ["ClientKind", "LiveClient", "close_producer", "live_clients", "new_admin",
           "new_consumer", "new_producer"]
