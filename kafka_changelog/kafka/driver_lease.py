"""A driver's hold on an application: one transactional producer that fences zombies.

The rules of who may hold an application are ``state/checkpoints/driver_claim.py``'s; this module
makes them stick across processes, the way Kafka's exactly-once fences zombies:

1. :meth:`DriverLease.acquire` waits while a live driver of another query holds the
   application, then starts a producer with the application's driver transactional id
   (``init_transactions`` fences the previous holder's producer: from then on none of
   its writes can commit), reads the checkpoint topic again and writes a claim with the
   next epoch in a transaction;
2. every later write of the holder (checkpoint commits, discards, guards) goes through
   that producer in a transaction that also refreshes the claim's heartbeat, so the
   store's read-compare-write of a commit is atomic across processes: a writer that was
   fenced after it read fails instead of committing (:class:`DriverFencedError`, naming
   the new holder);
3. the tasks of a batch carry the holder's epoch and refuse to commit their outputs when
   the checkpoint topic shows a newer claim (``task_commit.py``); the new holder fences
   the tasks' transactional ids after its claim is committed, so a zombie's task either
   saw the claim or is fenced at its commit.

Heartbeats go with every write and, between batches, from a daemon thread every quarter
of the lease; :meth:`DriverLease.release` (a clean stop) frees the application at once.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from ..errors import KafkaAccessError
from ..serialization import HEADER_SCHEMA
from ..state.checkpoints.driver_claim import (
    DRIVER_CLAIM_SCHEMA_HEADER,
    ApplicationHeldError,
    DriverClaim,
    DriverFencedError,
    DriverIdentity,
    Takeover,
    driver_claim_key,
)
from ..state.errors import CheckpointStoreError
from ..state.records import OutRecord
from .checkpoint_store import WRITER_HEADER, KafkaCheckpointStore
from .error_text import describe
from .live_clients import new_producer
from .task_commit import TRANSACTION_TIMEOUT_MS
from .transaction_calls import (
    TRANSACTIONAL_PRODUCER_DEFAULTS,
    TransactionCallTimeoutError,
    TransactionFencedError,
    commit_transaction_retrying,
    init_transactions_retrying,
    let_go,
    produce_waiting,
    producer_fenced,
    transaction_error,
)

logger = logging.getLogger(__name__)



#: Writes fenced while this driver still holds the claim (see :meth:`DriverLease.write`).
_WRITE_ATTEMPTS = 3

#: Claims in a row whose transaction failed with a broker error before :meth:`acquire`
#: gives up. Two drivers claiming at once fence each other's producer, and the broker may
#: answer the fenced one's commit with an unspecific error (UNKNOWN_SERVER_ERROR) instead of
#: PRODUCER_FENCED: that driver looks again; a broker that keeps failing is reported.
_CLAIM_ATTEMPTS = 4


def driver_transactional_id(application: str) -> str:
    """The transactional id of an application's driver: ``kafka-changelog-<application>-driver``
    (under the prefix ACL the tasks' ids need, ``kafka-changelog-<application>-``)."""
    return f"kafka-changelog-{application}-driver"


def _now_ms() -> int:
    return int(time.time() * 1000)


class DriverLease:
    """This process's hold on ``application`` in a Kafka checkpoint store (module doc).

    Thread-safe. Invariant: while :attr:`claim` is set, the newest claim in the topic is
    this one unless another driver took over, and every write through :meth:`write`
    either commits with this claim or raises :class:`DriverFencedError`.
    """

    def __init__(self, store: KafkaCheckpointStore, application: str, lease_s: float,
                 identity: DriverIdentity | None = None,
                 producer_config: Mapping[str, Any] | None = None) -> None:
        if not lease_s > 0:
            raise ValueError(f"driver_lease_s must be positive, got {lease_s!r}")
        self.store = store
        self.application = application
        self.lease_s = lease_s
        self.identity = identity or DriverIdentity.of_this_process()
        self.transactional_id = driver_transactional_id(application)
        self._producer_config = dict(producer_config or {})
        self._producer: Producer | None = None
        #: The claim this lease holds (None before :meth:`acquire` and once lost).
        self.claim: DriverClaim | None = None
        #: The epoch at which the holder last fenced its tasks' transactional ids (its
        #: user's business: a driver fences them after every new claim).
        self.fenced_tasks_at: int | None = None
        # The store's own lock: a commit holds it while it writes through this lease, and
        # a heartbeat thread taking the two in the other order could deadlock.
        self._lock = store.lock
        self._last_write = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._running: Callable[[], bool] | None = None
        #: The epoch of this lease's latest claim (kept once lost, for errors).
        self._epoch: int | None = None

    @classmethod
    def of(cls, store: KafkaCheckpointStore, application: str, lease_s: float,
           producer_config: Mapping[str, Any] | None = None) -> DriverLease:
        """The store's lease of ``application`` (created on first use): once it holds a
        claim, the store writes that application's records through it."""
        with store.lock:
            lease = store.leases.get(application)
            if lease is None or not isinstance(lease, cls):
                lease = cls(store, application, lease_s, producer_config=producer_config)
                store.leases[application] = lease
            return lease

    # -- taking the application --------------------------------------------------------------

    def acquire(self, query_id: str, wait_s: float | None = None,
                running: Callable[[], bool] | None = None) -> DriverClaim:
        """Hold the application for a driver running Spark query ``query_id``.

        Returns at once when this lease holds it already. Otherwise waits while a live
        driver of another query holds it (up to ``wait_s``, default twice the lease: long
        enough for a dead holder's lease to run out), then claims it with the next epoch.
        Raises :class:`ApplicationHeldError` naming the holder.
        ``running`` tells the heartbeat thread whether the query still runs (once it
        does not, the lease is released); without it no thread beats and the claim
        lasts the lease after the last write.
        """
        with self._lock:
            self._running = running
            if self.claim is not None and self._still_mine():
                return self.claim
            self.claim = None
            deadline = time.monotonic() + (wait_s if wait_s is not None else 2 * self.lease_s)
            told = False
            failed_claims = 0
            while True:
                found = self._current()
                decision = (Takeover.FREE if found is None else
                            found.takeover(self.identity, query_id, _now_ms(), self.lease_s))
                if decision is Takeover.HELD:
                    assert found is not None
                    if time.monotonic() > deadline:
                        raise ApplicationHeldError(
                            f"application {self.application!r} is held by {found.describe()}, "
                            f"a live driver of another Spark query: a second driver would "
                            f"process the input twice. Stop that one first (a driver that "
                            f"died frees the application {self.lease_s:g} s after its last "
                            "heartbeat, or at once on the same host)")
                    if not told:
                        logger.warning("application %s is held by %s; waiting up to %.0f s "
                                       "for it to stop", self.application, found.describe(),
                                       deadline - time.monotonic())
                        told = True
                    time.sleep(min(1.0, self.lease_s / 4))
                    continue
                try:
                    claim = self._claim_after(found, query_id)
                except (KafkaAccessError, TransactionCallTimeoutError):
                    raise
                except CheckpointStoreError as exc:
                    failed_claims += 1
                    if failed_claims >= _CLAIM_ATTEMPTS:
                        raise
                    logger.warning("application %s: claiming failed (%s); looking again",
                                   self.application, exc)
                    self._drop_producer()
                    claim = None
                if claim is not None:
                    if found is not None and decision is not Takeover.OWN:
                        logger.warning("application %s: took over from %s (epoch %d now)",
                                       self.application, found.describe(), claim.epoch)
                    if running is not None:
                        self._start_heartbeats()
                    return claim
                # Another driver claimed in between: look again, after a random pause so
                # that two drivers racing do not fence each other in step.
                time.sleep(random.uniform(0.05, 0.3))

    def _claim_after(self, found: DriverClaim | None, query_id: str) -> DriverClaim | None:
        """Fence whoever held the id, then claim with the epoch after ``found`` unless a
        newer claim was committed meanwhile (None: then nothing was claimed)."""
        self._drop_producer()
        self._start_producer()
        latest = self._current()
        if (latest is None) != (found is None) or (
                latest is not None and found is not None and latest.epoch != found.epoch):
            self._drop_producer()
            return None
        now = _now_ms()
        claim = DriverClaim(self.application, (found.epoch if found else 0) + 1, self.identity,
                            query_id, now, now)
        try:
            self._transaction([], claim, f"the claim of application {self.application!r}")
        except TransactionFencedError:
            self._drop_producer()
            return None
        self.claim = claim
        self._epoch = claim.epoch
        return claim

    def _current(self) -> DriverClaim | None:
        """The newest committed claim (the store reads up to everything written)."""
        self.store.catch_up(self.store.config.request_timeout_s * 2, only_for=self.application)
        return self.store.driver_claim(self.application)

    def _still_mine(self) -> bool:
        found = self.store.driver_claim(self.application)
        return found is not None and self._is_mine(found)

    def _is_mine(self, found: DriverClaim) -> bool:
        return (self.claim is not None and found.epoch == self.claim.epoch
                and found.driver.driver_id == self.identity.driver_id)

    def check(self) -> DriverClaim:
        """This lease's claim; :class:`DriverFencedError` when another driver took over."""
        with self._lock:
            claim = self.claim
            found = self.store.driver_claim(self.application)
            if claim is None or found is None or not self._is_mine(found):
                raise self._fenced("run a batch", found)
            return claim

    # -- writing as the holder ---------------------------------------------------------------

    def write(self, records: list[OutRecord], what: str) -> None:
        """Write ``records`` (to the checkpoint topic) in a transaction that refreshes the
        claim; blocks until committed. :class:`DriverFencedError` when another driver
        took over: nothing of it is visible then."""
        with self._lock:
            self._write_as_holder(records, what, released=False)

    def _write_as_holder(self, records: list[OutRecord], what: str, released: bool) -> None:
        for _ in range(_WRITE_ATTEMPTS):
            claim = self.claim
            if claim is None:
                raise self._fenced(f"write {what}", self.store.driver_claim(self.application))
            try:
                self._transaction(records, dataclasses.replace(
                    claim, heartbeat_ms=_now_ms(), released=released), what)
                return
            except TransactionFencedError:
                # A driver that meant to take over (and then saw this claim, or lost a
                # race) may have fenced the producer without claiming: still the holder,
                # this one fences in turn and writes again.
                self._drop_producer()
                if self._current_is_mine():
                    self._start_producer()
                    if self._current_is_mine():
                        continue
                self._lose()
                raise self._fenced(f"write {what}",
                                   self.store.driver_claim(self.application)) from None
        self._lose()
        raise self._fenced(f"write {what}", self.store.driver_claim(self.application))

    def _current_is_mine(self) -> bool:
        found = self._current()
        return found is not None and self._is_mine(found)

    def _lose(self) -> None:
        self._drop_producer()
        self.claim = None
        self._stop.set()

    def heartbeat(self) -> None:
        """Refresh the claim (a transaction with the claim alone)."""
        self.write([], f"a heartbeat of application {self.application!r}")

    def release(self) -> None:
        """Free the application at once (a clean stop), stop the heartbeats and close the
        producer; a lease that lost its claim only lets its producer go. Returns once the
        heartbeat thread ended (it ends within one heartbeat: bounded by the store's
        ``retry_bound_s`` plus its request timeout), unless called from that thread."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            if self.claim is not None and self._producer is not None:
                try:
                    self._write_as_holder(
                        [], f"the release of application {self.application!r}", released=True)
                except Exception as exc:  # the next driver waits out the lease instead
                    logger.warning("application %s: releasing the driver claim failed: %s",
                                   self.application, exc)
            self.claim = None
            self._drop_producer()

    def _fenced(self, doing: str, found: DriverClaim | None) -> DriverFencedError:
        holder = found.describe() if found is not None else "nobody (the claim was reset)"
        mine = f"epoch {self._epoch}" if self._epoch is not None else "no claim yet"
        return DriverFencedError(
            f"cannot {doing}: application {self.application!r} is now held by {holder}, "
            f"not by this driver ({self.identity.host}, pid {self.identity.pid}, {mine}): "
            "another driver took it over, and this one stops without committing")

    # -- the producer --------------------------------------------------------------------------

    def _start_producer(self) -> None:
        config = self.store.config
        producer = new_producer({
            **TRANSACTIONAL_PRODUCER_DEFAULTS, **config.producer(),
            "message.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS, **self._producer_config,
            "transactional.id": self.transactional_id, "enable.idempotence": True,
            "acks": "all"}, f"driver lease of application {self.application}")
        try:
            init_transactions_retrying(producer, self.transactional_id,
                                       config.request_timeout_s, config.retry_bound_s)
        except KafkaException as exc:
            let_go(producer)
            raise transaction_error("starting the driver's transactions", exc.args[0],
                                    self.transactional_id) from exc
        except BaseException:
            let_go(producer)
            raise
        self._producer = producer

    def _transaction(self, records: list[OutRecord], claim: DriverClaim, what: str) -> None:
        if self._producer is None:
            self._start_producer()
        producer = self._producer
        assert producer is not None
        topic = self.store.config.topic
        claim_record = OutRecord(0, driver_claim_key(self.application).encode(),
                                 claim.to_bytes(),
                                 [(HEADER_SCHEMA, DRIVER_CLAIM_SCHEMA_HEADER.encode())])
        try:
            producer.begin_transaction()
            writer = (WRITER_HEADER, self.identity.driver_id.encode())
            for record in [*records, claim_record]:
                produce_waiting(producer, topic, record.value, record.key, record.partition,
                                [*record.headers, writer])
            commit_transaction_retrying(producer, self.store.config.request_timeout_s,
                                        self.transactional_id, self.store.config.retry_bound_s)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if producer_fenced(error):
                raise TransactionFencedError(
                    f"writing {what} with transactional id {self.transactional_id!r}: "
                    f"{describe(error)}") from exc
            try:
                producer.abort_transaction(self.store.config.request_timeout_s)
            except KafkaException:
                self._drop_producer()
            raise transaction_error(f"writing {what}", error, self.transactional_id) from exc
        self._last_write = time.monotonic()
        self.store.apply_own(claim_record)

    def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            let_go(producer)

    def _query_runs(self) -> bool:
        running = self._running
        try:
            return running is None or running()
        except Exception as exc:  # the session is gone: so is the query
            logger.info("application %s: cannot tell whether the query runs (%s): taken "
                        "as stopped", self.application, exc)
            return False

    # -- heartbeats between batches --------------------------------------------------------------

    def _start_heartbeats(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(self._stop,), daemon=True,
                                        name=f"kafka-changelog-lease-{self.application}")
        self._thread.start()

    def _beat(self, stop: threading.Event) -> None:
        interval = self.lease_s / 4
        while not stop.wait(interval / 2):
            if not self._query_runs():
                logger.info("application %s: the query stopped; releasing the driver claim",
                            self.application)
                self.release()
                return
            if time.monotonic() - self._last_write < interval:
                continue
            try:
                self.heartbeat()
            except DriverFencedError as exc:
                logger.error("%s", exc)
                return
            except Exception as exc:  # a broker outage: the next beat tries again
                logger.warning("application %s: driver heartbeat failed: %s",
                               self.application, exc)


__all__ = ["DriverLease", "driver_transactional_id"]
