"""Checkpoint commits that carry output records: one Kafka transaction for both.

A stream processor's outputs and its state are exactly-once together only if the
outputs of a step become visible exactly when the checkpoint that includes the
step's state does. :class:`TransactionalCommitter` writes a step's output records
(to any topics) and the checkpoint store's commit records in one Kafka transaction:
either both are committed or neither is visible to ``read_committed`` consumers
(librdkafka's default; Java clients need ``isolation.level=read_committed``).

A crashed committer leaves at most an open transaction behind. The next committer
with the same ``transactional.id`` fences the old one and aborts it when it starts
(``init_transactions``): the outputs of the step that crashed are never visible, and
running the step again writes them once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from ..errors import KafkaAccessError
from ..state.checkpoints.checkpoint import CompletedCheckpoint
from ..state.errors import CheckpointStoreError
from .checkpoint_store import KafkaCheckpointStore
from .error_text import describe, is_access_error
from .live_clients import new_producer
from .transaction_calls import (
    TRANSACTIONAL_PRODUCER_DEFAULTS,
    TransactionAbortedError,
    commit_transaction_retrying,
    init_transactions_retrying,
    let_go,
    produce_waiting,
    producer_fenced,
    transaction_error,
)

#: Causes of a failed abort that mean another producer of the transactional id took over
#: (``_FATAL``: a fatal error whose cause was not reported, taken as the same).
_TAKEN_OVER = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
               KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FATAL)


@dataclass(frozen=True)
class OutputRecord:
    """One output record to commit with a checkpoint (``partition=None``: by key)."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None


class TransactionalCommitter:
    """Commits checkpoints of ``store`` together with output records, atomically.

    ``transactional_id`` must be stable across restarts of the same application and
    operator (that is what fences a crashed predecessor) and unique among live
    committers. ``producer_config`` adds librdkafka settings for the transactional
    producer (the store's client settings, security included, are used already).
    """

    def __init__(
        self,
        store: KafkaCheckpointStore,
        transactional_id: str,
        producer_config: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.store = store
        self.transactional_id = transactional_id
        # The fatal error librdkafka reported in the background (a fencing, say): later
        # calls fail with a bare ``_FATAL`` that does not say why.
        self._fatal: KafkaError | None = None
        # Once fenced, the producer is finished (librdkafka answers later calls with
        # unrelated errors, "conflicting call in progress"): every commit says so at once.
        self._fenced: KafkaError | None = None
        self.timeout_s = timeout_s if timeout_s is not None else store.config.request_timeout_s
        self._producer_config = dict(producer_config or {})
        self._producer = self._started_producer()
        self.commits = 0

    def commit(
        self,
        checkpoint: CompletedCheckpoint,
        outputs: Iterable[OutputRecord],
        before_commit: Callable[[], None] | None = None,
    ) -> list[CompletedCheckpoint]:
        """Commit ``checkpoint`` and ``outputs`` in one transaction; what retention subsumed.

        ``before_commit`` runs once everything is produced, just before the transaction
        commits (crash tests kill the process there). Raises
        :class:`TransactionAbortedError` when the transaction had to be aborted (nothing
        of it is visible; the step may be retried) and :class:`TransactionFencedError`
        when another committer took over.
        """
        return self.store.commit(checkpoint, self.persister(outputs, before_commit))

    def persister(
        self, outputs: Iterable[OutputRecord], before_commit: Callable[[], None] | None = None,
    ) -> Callable[[CompletedCheckpoint], None]:
        """The ``persist`` function for :meth:`CheckpointStore.commit` (and
        ``CheckpointCoordinator.complete``) that commits ``outputs`` with the checkpoint."""
        records = list(outputs)

        def persist(checkpoint: CompletedCheckpoint) -> None:
            self._run_transaction(checkpoint, records, before_commit)

        return persist

    def _started_producer(self) -> Any:
        """A transactional producer of :attr:`transactional_id` whose transactions are
        initialized: that fences any earlier producer of the id and aborts its open
        transaction."""
        producer = new_producer({
            **TRANSACTIONAL_PRODUCER_DEFAULTS,
            **self.store.config.common(),
            "transactional.id": self.transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            **self._producer_config,
            "error_cb": self._on_client_error,
        }, f"checkpoint commits of {self.transactional_id}")
        try:
            init_transactions_retrying(producer, self.transactional_id, self.timeout_s,
                                       self.store.config.retry_bound_s)
        except KafkaException as exc:
            error = self._error("starting transactions", exc.args[0])
            let_go(producer)
            raise error from exc
        except BaseException:
            let_go(producer)
            raise
        return producer

    def _run_transaction(self, checkpoint: CompletedCheckpoint, outputs: list[OutputRecord],
                         before_commit: Callable[[], None] | None) -> None:
        what = (f"checkpoint {checkpoint.checkpoint_id} of application "
                f"{checkpoint.application!r} with {len(outputs)} output records")
        if self._fenced is not None:
            raise self._error(f"committing {what}", self._fenced)
        producer = self._producer
        try:
            producer.begin_transaction()
            for record in outputs:
                self._produce(record.topic, record.value, record.key, record.partition,
                              list(record.headers))
            for out in self.store.commit_records(checkpoint):
                self._produce(self.store.topic, out.value, out.key, out.partition,
                              list(out.headers))
            if before_commit is not None:
                before_commit()
            self._commit_transaction()
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.txn_requires_abort():
                self._abort_after(exc)
                raise TransactionAbortedError(
                    f"{what} was aborted, nothing of it is visible: {describe(error)}") from exc
            raise self._error(f"committing {what}", error) from exc
        except Exception as exc:
            # E.g. before_commit failed: leave no transaction open, and say what failed.
            self._abort_after(exc)
            raise
        self.commits += 1

    def _produce(self, topic: str, value: bytes | None, key: bytes | None,
                 partition: int | None, headers: list[tuple[str, bytes]]) -> None:
        produce_waiting(self._producer, topic, value, key, partition, headers)

    def _commit_transaction(self) -> None:
        commit_transaction_retrying(self._producer, self.timeout_s, self.transactional_id,
                                    self.store.config.retry_bound_s)

    def _abort_after(self, failure: Exception) -> None:
        """Abort the open transaction because ``failure`` happened in it. When librdkafka
        cannot abort it (seen: INVALID_TXN_STATE right after a coordinator moved, its
        issue #4849), a new producer of the id aborts it on the broker as it starts, and
        ``failure`` stays the error to report; a producer fenced for real stays fenced."""
        try:
            self._producer.abort_transaction(self.timeout_s)
            return
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() == KafkaError._FATAL:
                self._serve_fatal_error()
            cause = self._fatal or error
            if cause.code() in _TAKEN_OVER or is_access_error(cause):
                # A successor took over (a new producer would fence it in turn), or an
                # ACL refuses: nothing a new producer could mend.
                raise self._error("aborting a transaction", error) from failure
        # The new producer first (it fences the old one): should it fail to start, the
        # committer keeps the old one, and that error says why.
        fresh = self._started_producer()
        stale, self._producer = self._producer, fresh
        let_go(stale)
        self._fatal = None  # the stale producer's (its fencing by the fresh one included)

    def _on_client_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._fatal = error

    def _serve_fatal_error(self) -> None:
        """Learn the cause of a fatal error (e.g. fencing): serve the error callback that
        names it, or take it from ``poll`` itself, which raises it instead (seen under
        load: a ``KafkaException`` of the fencing out of ``poll(0)``)."""
        try:
            self._producer.poll(0)
        except KafkaException as exc:
            self._fatal = exc.args[0]

    def _error(self, doing: str, error: KafkaError) -> CheckpointStoreError | KafkaAccessError:
        if error.code() == KafkaError._FATAL:
            self._serve_fatal_error()
            error = self._fatal or error
        if producer_fenced(error) and not is_access_error(error):
            self._fenced = error
        return transaction_error(doing, error, self.transactional_id, "another committer")

    def close(self) -> None:
        """Release the producer (nothing is pending between commits)."""
        let_go(self._producer, self.timeout_s)

    def __enter__(self) -> TransactionalCommitter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
