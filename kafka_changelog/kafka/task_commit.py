"""A task's outputs and its part of a checkpoint, in one Kafka transaction of its own.

Each subtask of a streaming operator commits with its own transactional id (stable
per application, operator and subtask index). The protocol makes every subtask's
outputs visible exactly once, whichever attempt of the task, or which re-run of the
batch, gets there first:

1. the committer's producer starts with ``init_transactions``, which fences every
   earlier producer of the id (a zombie attempt can no longer commit) and aborts its
   open transaction;
2. :meth:`SubtaskCommitter.find` then reads the checkpoint topic from the batch's
   floor (its end offset when the batch started) up to the *high watermark*, waiting
   for open transactions of others to end, so a commit of an earlier attempt is seen
   even when it lies beyond another subtask's open transaction;
3. if that attempt committed, its commit is reused and nothing is computed or written;
   else the task computes, and :meth:`SubtaskCommitter.commit` writes the outputs and
   the :class:`~kafka_changelog.state.checkpoints.subtask_commit.SubtaskCommit` record in one
   transaction. When another attempt took the id over meanwhile (this producer is
   fenced), the committer starts a new producer (fencing that one in turn), looks
   again, and reuses what the other attempt committed or commits its own.

At most one producer of an id is current at any time and a producer commits only
after it has looked, so two attempts never both commit a subtask's outputs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from ..state.checkpoints.checkpoint_store import PARTITION, CheckpointStore
from ..state.checkpoints.driver_claim import (
    DriverClaim,
    DriverFencedError,
    DriverHolder,
    driver_claim_key,
)
from ..state.checkpoints.subtask_commit import SubtaskCommit
from ..state.errors import CheckpointStoreError
from .checkpoint_store import CheckpointStoreConfig, high_watermark
from .consume import consume_range, end_of_partition
from .error_text import access_error, describe, is_access_error
from .live_clients import new_admin, new_consumer, new_producer
from .transaction_calls import (
    TRANSACTIONAL_PRODUCER_DEFAULTS,
    TransactionAbortedError,
    TransactionFencedError,
    commit_transaction_retrying,
    init_transactions_retrying,
    let_go,
    produce_waiting,
    producer_fenced,
    transaction_error,
)
from .transactional_commit import OutputRecord
from .transactional_owner import TransactionalIdOwner

logger = logging.getLogger(__name__)

#: librdkafka's transaction timeout for task transactions: a task killed inside one
#: holds back ``read_committed`` readers of its partitions at most this long (a retry
#: of the task aborts it at once).
TRANSACTION_TIMEOUT_MS = 60_000



def fence(config: CheckpointStoreConfig, transactional_ids: list[str],
          producer_config: Mapping[str, Any] | None = None) -> None:
    """Fence every producer of ``transactional_ids`` and abort their open transactions
    (a driver does this before it reads which subtasks committed, after a crash)."""
    for tid in transactional_ids:
        producer = new_producer(_transactional_settings(config, tid, producer_config),
                                f"fencing transactional id {tid}")
        try:
            init_transactions_retrying(producer, tid, config.request_timeout_s,
                                       config.retry_bound_s)
        except KafkaException as exc:
            raise transaction_error(f"fencing transactional id {tid!r}", exc.args[0], tid) from exc
        finally:
            let_go(producer)
        # Committers of this machine that kept a producer of the id know it at once.
        TransactionalIdOwner(config.bootstrap_servers, tid).claim()


class OutputTopicMissingError(CheckpointStoreError):
    """An output topic does not exist and the brokers would not create it."""


def check_output_topics(config: CheckpointStoreConfig, topics: list[str]) -> None:
    """Raise :class:`OutputTopicMissingError` when one of ``topics`` does not exist and the
    cluster does not create topics on first use: a transaction producing to it would only
    time out, far from the cause."""
    admin = new_admin(config.common(), "listing the output topics")
    try:
        metadata = admin.list_topics(timeout=config.request_timeout_s)
    except KafkaException as exc:
        raise transaction_error("listing topics for the outputs", exc.args[0], "-") from exc
    missing = sorted(set(topics) - set(metadata.topics))
    if not missing or _auto_creates(admin, metadata, config.request_timeout_s):
        return
    raise OutputTopicMissingError(
        f"output topic {missing[0]!r} does not exist on {config.bootstrap_servers} and its "
        "brokers do not create topics on first use (auto.create.topics.enable=false): "
        f"create it first, e.g. kafka-topics.sh --create --topic {missing[0]}")


def _auto_creates(admin: AdminClient, metadata: Any, timeout_s: float) -> bool:
    """Whether the brokers create a topic on first use (unknown counts as no)."""
    broker = ConfigResource(ConfigResource.Type.BROKER, str(next(iter(metadata.brokers))))
    try:
        configs = admin.describe_configs([broker])[broker].result(timeout_s)
    except KafkaException:
        return False
    entry = configs.get("auto.create.topics.enable")
    return entry is not None and str(entry.value).lower() == "true"


class SubtaskCommitter:
    """Commits one subtask's outputs with its :class:`SubtaskCommit` (see the module)."""

    def __init__(self, config: CheckpointStoreConfig, transactional_id: str,
                 producer_config: Mapping[str, Any] | None = None,
                 wait_s: float | None = None) -> None:
        self.config = config
        self.transactional_id = transactional_id
        self.producer_config = dict(producer_config or {})
        #: How long :meth:`find` waits for others' open transactions to end.
        self.wait_s = wait_s if wait_s is not None else (
            TRANSACTION_TIMEOUT_MS / 1000 + config.request_timeout_s)
        self._consumer = new_consumer(config.consumer(),
                                      f"subtask commits of {transactional_id}")
        self._ends = new_consumer({**config.consumer(), "isolation.level": "read_uncommitted"},
                                  f"subtask commits of {transactional_id} (uncommitted)")
        self._producer: Producer | None = None
        self._owner = TransactionalIdOwner(config.bootstrap_servers, transactional_id)
        self.commits = 0
        self.fenced = 0
        #: Transactional steps done again: a call retried after a retriable error
        #: (starting transactions, a commit), a transaction aborted or fenced and redone.
        self.retries = 0

    def start(self) -> None:
        """Make this committer's producer current, fencing earlier ones (no-op if it is;
        a producer another process of this machine took the id from is replaced)."""
        if self._producer is not None and self._owner.taken_over():
            self._drop_producer()
        if self._producer is not None:
            return
        producer = new_producer(_transactional_settings(self.config, self.transactional_id,
                                                        self.producer_config),
                                f"subtask commits of {self.transactional_id}")
        try:
            self.retries += init_transactions_retrying(
                producer, self.transactional_id, self.config.request_timeout_s,
                self.config.retry_bound_s)
        except KafkaException as exc:
            let_go(producer)
            raise transaction_error("starting transactions", exc.args[0],
                                    self.transactional_id) from exc
        except BaseException:
            let_go(producer)
            raise
        self._producer = producer
        self._owner.claim()

    def find(self, key: str, since: int, matches: Callable[[SubtaskCommit], bool],
             holder: DriverHolder | None = None) -> SubtaskCommit | None:
        """The latest committed record with ``key`` at or after offset ``since`` of the
        checkpoint topic, if ``matches`` accepts it (read up to the high watermark).

        With ``holder`` (the driver that planned the batch), raises
        :class:`DriverFencedError` when a newer driver claimed the application since.
        Records since ``since`` are first looked at uncommitted: only when one of them
        has ``key`` or is the application's claim does this wait for open transactions
        to end (those of other applications never stall it).
        """
        self.start()
        topic = self.config.topic
        end = high_watermark(self.config, self._ends)
        found: SubtaskCommit | None = None
        wanted = key.encode()
        claim_key = driver_claim_key(holder.application).encode() if holder else None
        where = f"checkpoint topic {topic}[{PARTITION}]"

        def on_error(error: KafkaError, position: int) -> int:
            if end_of_partition(error):
                return position
            if is_access_error(error):
                raise access_error(error, f"reading {where}", operation="READ", resource=topic)
            raise CheckpointStoreError(f"reading {where} at offset {position} failed: "
                                       f"{describe(error)}")

        def relevant(message: Any) -> bool:
            value = message.value()
            if value is None:
                return False
            if message.key() == wanted:
                return matches(SubtaskCommit.from_bytes(value, f"{where}@{message.offset()}"))
            return message.key() == claim_key and holder is not None and holder.superseded_by(
                DriverClaim.from_bytes(value, f"{where}@{message.offset()}"))

        if not any(relevant(message) for message in consume_range(
                self._ends, topic, PARTITION, since, end, self.config.request_timeout_s,
                on_error)):
            return None
        claim: DriverClaim | None = None
        for message in consume_range(self._consumer, topic, PARTITION, since, end,
                                     self.wait_s, on_error):
            if message.key() == wanted:
                value = message.value()
                found = (None if value is None else
                         SubtaskCommit.from_bytes(value, f"{where}@{message.offset()}"))
            elif claim_key is not None and message.key() == claim_key:
                value = message.value()
                seen = (None if value is None else
                        DriverClaim.from_bytes(value, f"{where}@{message.offset()}"))
                if seen is not None and holder is not None and holder.superseded_by(seen):
                    claim = seen
        if holder is not None and claim is not None:
            raise DriverFencedError(
                f"subtask commit {key!r} refused: application {holder.application!r} is "
                f"now held by {claim.describe()}, not by the driver that planned this batch "
                f"(epoch {holder.epoch}); that driver is a zombie, nothing of its batch is "
                "committed")
        return found if found is not None and matches(found) else None

    def commit(self, outputs: list[OutputRecord], commit: SubtaskCommit, since: int,
               in_transaction: Callable[[], None] | None = None,
               holder: DriverHolder | None = None) -> tuple[SubtaskCommit, bool]:
        """Commit ``outputs`` with ``commit`` unless another attempt of the same subtask
        and batch committed first: (the commit that holds, whether it is this one).

        ``in_transaction`` runs once everything is produced, before the commit. With
        ``holder``, a fenced commit that finds a newer driver's claim raises
        :class:`DriverFencedError` (see :meth:`find`).
        """
        def same(found: SubtaskCommit) -> bool:
            return found.is_for(commit.application, commit.operator_id,
                                commit.checkpoint_id, commit.batch_id, commit.query_id)

        for attempt in range(3):
            try:
                self._transaction(outputs, commit, in_transaction)
                self.commits += 1
                return commit, True
            except TransactionFencedError:
                # Another attempt took the id over: take it back, then look again.
                self.fenced += 1
                self._drop_producer()
                found = self.find(commit.key, since, same, holder)
                if found is not None:
                    logger.info("subtask %d of checkpoint %d: another attempt committed "
                                "first; its outputs stand", commit.subtask_index,
                                commit.checkpoint_id)
                    return found, False
                self.retries += 1
            except TransactionAbortedError as exc:
                self.retries += 1
                logger.warning("retrying the transaction of subtask %d (attempt %d): %s",
                               commit.subtask_index, attempt + 1, exc)
        raise CheckpointStoreError(
            f"committing subtask {commit.subtask_index} of checkpoint {commit.checkpoint_id} "
            f"with transactional id {self.transactional_id!r} failed 3 times")

    def _transaction(self, outputs: list[OutputRecord], commit: SubtaskCommit,
                     in_transaction: Callable[[], None] | None) -> None:
        if self._producer is not None and self._owner.taken_over():
            # Fenced by a producer of this machine: what the broker would answer, without
            # asking (the caller takes the id back and looks again before it commits).
            raise TransactionFencedError(
                f"transactional id {self.transactional_id!r} was taken over by another "
                "producer of this machine")
        self.start()
        producer = self._producer
        assert producer is not None
        records = CheckpointStore.subtask_commit_records(commit)
        what = (f"subtask {commit.subtask_index} of checkpoint {commit.checkpoint_id} "
                f"(application {commit.application!r}, operator {commit.operator_id!r}) with "
                f"{len(outputs)} output records")
        try:
            producer.begin_transaction()
            for output in outputs:
                self._produce(output.topic, output.value, output.key, output.partition,
                              list(output.headers))
            for record in records:
                self._produce(self.config.topic, record.value, record.key, record.partition,
                              record.headers)
            if in_transaction is not None:
                in_transaction()
            self._commit_transaction()
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if producer_fenced(error):
                raise transaction_error(f"committing {what}", error, self.transactional_id) from exc
            if error.txn_requires_abort():
                self._abort()
                raise TransactionAbortedError(
                    f"{what} was aborted, nothing of it is visible: {describe(error)}") from exc
            raise transaction_error(f"committing {what}", error, self.transactional_id) from exc
        except BaseException:
            try:
                self._abort()
            except Exception as exc:  # the original error matters more
                logger.warning("aborting the transaction of %s failed: %s", what, exc)
            raise

    def _produce(self, topic: str, value: bytes | None, key: bytes | None,
                 partition: int | None, headers: list[tuple[str, bytes]]) -> None:
        assert self._producer is not None
        produce_waiting(self._producer, topic, value, key, partition, headers)

    def _commit_transaction(self) -> None:
        assert self._producer is not None
        self.retries += commit_transaction_retrying(
            self._producer, self.config.request_timeout_s, self.transactional_id,
            self.config.retry_bound_s)

    def _abort(self) -> None:
        if self._producer is None:
            return
        try:
            self._producer.abort_transaction(self.config.request_timeout_s)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if producer_fenced(error):
                self._drop_producer()
                return
            raise transaction_error("aborting a transaction", error, self.transactional_id) from exc

    def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            let_go(producer)

    def close(self) -> None:
        """Release the producer and consumers (idempotent)."""
        self._drop_producer()
        for consumer in (self._consumer, self._ends):
            with contextlib.suppress(RuntimeError):  # closed already
                consumer.close()


def _transactional_settings(config: CheckpointStoreConfig, transactional_id: str,
                            producer_config: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        **TRANSACTIONAL_PRODUCER_DEFAULTS,
        **config.common(),
        "linger.ms": 5,
        "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
        **(producer_config or {}),
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "acks": "all",
    }


__all__ = ["TRANSACTION_TIMEOUT_MS", "SubtaskCommitter", "fence"]
