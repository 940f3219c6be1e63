"""The DSTL's writer mechanics, shared by every storage.

A :class:`BufferingChangelogWriter` keeps the active change set, the rolled-over
sets not yet handed to the storage, and one upload future per set that was
(handed over to be) persisted. Storages only say how to upload change sets and
how to build a handle; sequence numbers, truncation, preemptive persistence,
reuse of earlier uploads, retry after failure and ownership tracking live here.
"""

from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Generic, TypeVar

from .change import META_KEY_GROUP
from .change_set import ChangeSet
from .errors import (
    KafkaAccessError,
    PersistError,
    WriterClosedError,
)
from .keygroups import KeyGroupRange
from .registry import WRITER_HOLD, ChangelogRegistry, checkpoint_hold
from .sequence import SequenceNumber, SequenceNumberOutOfRangeError
from .writer import SnapshotResult, StateChangelogWriter, check_change

logger = logging.getLogger(__name__)

H = TypeVar("H")
L = TypeVar("L")

#: Changes :meth:`BufferingChangelogWriter.append_all` adds between two looks at the
#: preemptive-persist threshold.
_APPEND_SLICE = 4096



class BufferingChangelogWriter(StateChangelogWriter[H], Generic[H, L]):
    """Writer state machine; subclasses implement :meth:`_upload` and :meth:`_make_handle`.

    ``L`` is the storage's location of a persisted change set (for Kafka: the
    partition and offsets of its record).
    """

    def __init__(
        self,
        log_id: str,
        key_group_range: KeyGroupRange,
        registry: ChangelogRegistry[L],
        preemptive_persist_threshold_bytes: int | None = None,
    ) -> None:
        self._log_id = log_id
        self._range = key_group_range
        self._registry = registry
        self._threshold = preemptive_persist_threshold_bytes
        # Upload callbacks arrive on storage threads; re-entrant because an upload
        # that completes at once calls back while persist still holds the lock.
        self._lock = threading.RLock()
        self._active_sqn = SequenceNumber.initial()
        # The active set as two columns (see ChangeSet): appending extends two lists.
        self._active_key_groups: list[int] = []
        self._active_payloads: list[bytes] = []
        self._active_bytes = 0
        self._pending: dict[SequenceNumber, ChangeSet] = {}
        self._pending_bytes = 0
        self._uploads: dict[SequenceNumber, Future[L]] = {}
        self._lowest = SequenceNumber.initial()
        self._closed = False

    # -- storage hooks -------------------------------------------------------------

    @abstractmethod
    def _upload(self, change_sets: Sequence[ChangeSet]) -> list[Future[L]]:
        """Start making ``change_sets`` durable: one future per set, in order."""

    @abstractmethod
    def _make_handle(
        self, parts: Sequence[tuple[SequenceNumber, L]], checkpoint_id: int
    ) -> H:
        """A handle of the persisted sets ``parts`` (ascending sequence numbers)."""

    # -- protocol ------------------------------------------------------------------

    @property
    def log_id(self) -> str:
        return self._log_id

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self._range

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def unpersisted_bytes(self) -> int:
        """Payload bytes appended but not yet handed to the storage."""
        return self._active_bytes + self._pending_bytes

    def append(self, key_group: int, payload: bytes) -> None:
        # The hot path: no lock (only the operator thread touches the active set) and no
        # StateChange validation beyond the range check.
        key_groups = self._range
        if not key_groups.start <= key_group <= key_groups.end or type(payload) is not bytes:
            self._check_open("append")
            check_change(key_groups, self._log_id, key_group, payload)
        if self._closed:
            raise WriterClosedError(self._log_id, "append")
        self._active_key_groups.append(key_group)
        self._active_payloads.append(payload)
        self._active_bytes += len(payload)
        if self._threshold is not None and (
            self._active_bytes + self._pending_bytes >= self._threshold
        ):
            self._persist_preemptively()

    def append_all(self, key_groups: Sequence[int], payloads: Sequence[bytes]) -> None:
        # Checked first (bad input adds nothing), then added a slice at a time: two C-level
        # extends per slice instead of a call per change, and the preemptive-persist
        # threshold still looked at every slice, so memory stays bounded.
        self._check_open("append")
        if len(key_groups) != len(payloads):
            raise ValueError(f"append_all: {len(key_groups)} key groups but "
                             f"{len(payloads)} payloads")
        if not payloads:
            return
        key_group_range = self._range
        # Counting exact bytes types in C is several times faster than a generator.
        if not (key_group_range.start <= min(key_groups)
                and max(key_groups) <= key_group_range.end) or list(
                    map(type, payloads)).count(bytes) != len(payloads):
            for key_group, payload in zip(key_groups, payloads, strict=True):
                check_change(key_group_range, self._log_id, key_group, payload)
        for start in range(0, len(payloads), _APPEND_SLICE):
            stop = start + _APPEND_SLICE
            some = payloads[start:stop]
            # Not locals: a preemptive persist rolls the active set over to new lists.
            self._active_key_groups.extend(key_groups[start:stop])
            self._active_payloads.extend(some)
            self._active_bytes += sum(map(len, some))
            if self._threshold is not None and (
                self._active_bytes + self._pending_bytes >= self._threshold
            ):
                self._persist_preemptively()

    def append_meta(self, payload: bytes) -> None:
        self._check_open("append")
        if type(payload) is not bytes:
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        self._active_key_groups.append(META_KEY_GROUP)
        self._active_payloads.append(payload)
        self._active_bytes += len(payload)

    def initial_sequence_number(self) -> SequenceNumber:
        return SequenceNumber.initial()

    def next_sequence_number(self) -> SequenceNumber:
        with self._lock:
            self._rollover()
            return self._active_sqn

    def persist(
        self, from_sqn: SequenceNumber, checkpoint_id: int
    ) -> Future[SnapshotResult[H]]:
        with self._lock:
            self._check_open("persist")
            if not self._lowest <= from_sqn <= self._active_sqn:
                raise SequenceNumberOutOfRangeError(from_sqn, self._lowest, self._active_sqn)
            self._rollover()
            self._start_upload([s for s in self._pending if s >= from_sqn])
            parts = sorted(
                (sqn, future) for sqn, future in self._uploads.items() if sqn >= from_sqn
            )
        return self._combine(parts, checkpoint_id)

    def confirm(self, from_sqn: SequenceNumber, to_sqn: SequenceNumber, checkpoint_id: int) -> None:
        self._registry.add_hold(self._log_id, from_sqn, to_sqn, checkpoint_hold(checkpoint_id))

    def reset(self, from_sqn: SequenceNumber, to_sqn: SequenceNumber, checkpoint_id: int) -> None:
        self._registry.release(self._log_id, from_sqn, to_sqn, checkpoint_hold(checkpoint_id))

    def truncate(self, to_sqn: SequenceNumber) -> None:
        with self._lock:
            self._check_open("truncate")
            if to_sqn > self._active_sqn:
                raise SequenceNumberOutOfRangeError(
                    to_sqn, self._lowest, self._active_sqn, operation="truncate"
                )
            self._drop(lambda sqn: sqn < to_sqn)
            self._lowest = max(self._lowest, to_sqn)
        self._registry.release(self._log_id, None, to_sqn, WRITER_HOLD)

    def truncate_and_close(self, from_sqn: SequenceNumber) -> None:
        with self._lock:
            self._drop(lambda sqn: sqn >= from_sqn)
            if self._active_sqn >= from_sqn:
                self._clear_active()
        self._registry.release(self._log_id, from_sqn, None, WRITER_HOLD)
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._clear_active()
            self._drop(lambda sqn: True)
        # What was persisted but never confirmed is nobody's any more.
        self._registry.release(self._log_id, None, None, WRITER_HOLD)

    # -- mechanics -----------------------------------------------------------------

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise WriterClosedError(self._log_id, operation)

    def _persist_preemptively(self) -> None:
        with self._lock:
            self._rollover()
            logger.debug("log %s: persisting %d bytes preemptively", self._log_id,
                         self._pending_bytes)
            self._start_upload(list(self._pending))

    def _rollover(self) -> None:
        if not self._active_payloads:
            return
        change_set = ChangeSet(self._active_sqn, self._active_key_groups,
                               self._active_payloads, self._active_bytes)
        self._pending[self._active_sqn] = change_set
        self._pending_bytes += self._active_bytes
        self._active_key_groups, self._active_payloads = [], []
        self._active_bytes = 0
        self._active_sqn = self._active_sqn.next()

    def _clear_active(self) -> None:
        self._active_key_groups.clear()
        self._active_payloads.clear()
        self._active_bytes = 0

    def _drop(self, doomed: Callable[[SequenceNumber], bool]) -> None:
        for sqn in [s for s in self._pending if doomed(s)]:
            self._pending_bytes -= self._pending.pop(sqn).size_bytes
        for sqn in [s for s in self._uploads if doomed(s)]:
            # An upload still in flight sees it is no longer wanted when it completes.
            del self._uploads[sqn]

    def _start_upload(self, sequence_numbers: list[SequenceNumber]) -> None:
        if not sequence_numbers:
            return
        change_sets = [self._pending.pop(sqn) for sqn in sorted(sequence_numbers)]
        self._pending_bytes -= sum(cs.size_bytes for cs in change_sets)
        try:
            futures = self._upload(change_sets)
        except BaseException:
            # Nothing was handed over for sure: keep the sets so that a later persist retries
            # (records that did go out are duplicates the reader drops).
            for change_set in change_sets:
                self._pending[change_set.sequence_number] = change_set
            self._pending_bytes += sum(cs.size_bytes for cs in change_sets)
            raise
        for change_set, future in zip(change_sets, futures, strict=True):
            self._uploads[change_set.sequence_number] = future
            future.add_done_callback(partial(self._on_uploaded, change_set))

    def _on_uploaded(self, change_set: ChangeSet, future: Future[L]) -> None:
        sqn = change_set.sequence_number
        error = future.exception()
        with self._lock:
            wanted = self._uploads.get(sqn) is future
            if error is not None:
                if wanted:
                    # Not durable: hand the set back so a later persist retries it.
                    logger.warning("log %s: change set %s not durable, sent again by the next "
                                   "persist: %s", self._log_id, sqn, error)
                    del self._uploads[sqn]
                    self._pending[sqn] = change_set
                    self._pending_bytes += change_set.size_bytes
                return
            self._registry.register(self._log_id, sqn, future.result())
        if not wanted:
            # Truncated or closed while in flight: durable, but nobody needs it.
            self._registry.release(self._log_id, sqn, sqn.next(), WRITER_HOLD)

    def _combine(
        self, parts: list[tuple[SequenceNumber, Future[L]]], checkpoint_id: int
    ) -> Future[SnapshotResult[H]]:
        """One future for the persist of ``parts``: the handle once every part is durable.

        A part refused for access (:class:`KafkaAccessError`: a missing ACL, credentials)
        fails the persist at once with that error itself, without waiting for the other
        parts (no retry cures it); other failures wait for every part and raise
        :class:`PersistError` naming how many failed, the first as its cause.
        """
        result: Future[SnapshotResult[H]] = Future()
        result.set_running_or_notify_cancel()
        remaining = [len(parts)]
        failed_early = [False]
        lock = threading.Lock()

        def fail(error: BaseException) -> None:
            with lock:
                if failed_early[0]:
                    return
                failed_early[0] = True
            result.set_exception(error)

        def finish() -> None:
            failed = [(sqn, f.exception()) for sqn, f in parts if f.exception() is not None]
            if failed:
                result.set_exception(self._persist_error(checkpoint_id, failed, len(parts)))
                return
            located = [(sqn, f.result()) for sqn, f in parts]
            try:
                handle = self._make_handle(located, checkpoint_id)
            except Exception as exc:  # a handle that cannot be built is a failed persist
                result.set_exception(exc)
                return
            result.set_result(SnapshotResult(handle))

        def on_done(future: Future[L]) -> None:
            error = future.exception()
            if isinstance(error, KafkaAccessError):
                fail(error)
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0 and not failed_early[0]
            if last:
                finish()

        if not parts:
            finish()
        for _, future in parts:
            future.add_done_callback(on_done)
        return result

    def _persist_error(self, checkpoint_id: int,
                       failed: Sequence[tuple[SequenceNumber, BaseException | None]],
                       total: int) -> BaseException:
        """What a persist whose ``failed`` parts (of ``total``) are not durable raises: an
        access error as it is (the type the caller acts on), else a :class:`PersistError`
        with the first failure as its cause."""
        access = next((e for _, e in failed if isinstance(e, KafkaAccessError)), None)
        if access is not None:
            return access
        sqn, cause = failed[0]
        error = PersistError(
            f"persist for checkpoint {checkpoint_id} of log {self._log_id} failed: "
            f"{len(failed)} of {total} change sets not durable "
            f"(first: sequence number {sqn}: {cause})"
        )
        error.__cause__ = cause
        return error
