"""How a persist fails (``BufferingChangelogWriter``, whatever the storage): an access error
(a missing ACL) fails it at once, as itself, without waiting for its other change sets;
other failures wait for every set and raise ``PersistError`` with the first as cause.

The uploads here are futures completed by hand (the writer's mechanics, not a storage);
the same against a real SASL broker with ACLs is in ``tests/kafka/test_kafka_security``."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from kafka_changelog import KafkaAuthorizationError, KeyGroupRange, PersistError
from kafka_changelog.change_set import ChangeSet
from kafka_changelog.memory.writer import InMemoryChangelogWriter
from kafka_changelog.registry import ChangelogRegistry


class HeldUploads(InMemoryChangelogWriter):
    """A writer whose uploads complete when the test says."""

    def __init__(self) -> None:
        super().__init__("log", KeyGroupRange.of(0, 127), ChangelogRegistry())
        self.uploads: list[tuple[ChangeSet, Future[ChangeSet]]] = []

    def _upload(self, change_sets: Sequence[ChangeSet]) -> list[Future[ChangeSet]]:
        futures: list[Future[ChangeSet]] = []
        for change_set in change_sets:
            future: Future[ChangeSet] = Future()
            self.uploads.append((change_set, future))
            futures.append(future)
        return futures


def two_sets(writer: HeldUploads) -> None:
    """Two change sets not yet persisted (the first rolled over by a sequence number)."""
    writer.append(1, b"a")
    writer.next_sequence_number()
    writer.append(2, b"b")


DENIED = KafkaAuthorizationError(
    "producing to t[0] failed: SASL_SSL user 'alice' lacks the ACL WRITE on Topic 't'",
    operation="WRITE", resource_type="Topic", resource="t")


def test_an_access_error_fails_the_persist_at_once_as_itself() -> None:
    writer = HeldUploads()
    two_sets(writer)
    persisted = writer.persist(writer.initial_sequence_number(), 1)
    assert len(writer.uploads) == 2
    writer.uploads[0][1].set_exception(DENIED)
    # The second set is still in flight: the persist does not wait for it.
    assert persisted.done()
    assert persisted.exception() is DENIED
    writer.uploads[1][1].set_result(writer.uploads[1][0])
    assert persisted.exception() is DENIED
    # The refused set was handed back: the next persist sends it again.
    writer.persist(writer.initial_sequence_number(), 2)
    assert [cs.payloads for cs, _ in writer.uploads[2:]] == [[b"a"]]
    writer.close()


def test_an_access_error_after_another_failure_is_still_what_the_persist_raises() -> None:
    writer = HeldUploads()
    two_sets(writer)
    persisted = writer.persist(writer.initial_sequence_number(), 1)
    writer.uploads[0][1].set_exception(PersistError("producing to t[0] failed: timed out"))
    assert not persisted.done()
    writer.uploads[1][1].set_exception(DENIED)
    assert persisted.exception() is DENIED
    writer.close()


def test_other_failures_wait_for_every_set_and_raise_persist_error() -> None:
    writer = HeldUploads()
    two_sets(writer)
    persisted = writer.persist(writer.initial_sequence_number(), 1)
    cause = PersistError("producing to t[0] failed: _MSG_TIMED_OUT")
    writer.uploads[0][1].set_exception(cause)
    assert not persisted.done()
    writer.uploads[1][1].set_result(writer.uploads[1][0])
    error = persisted.exception()
    assert type(error) is PersistError
    assert str(error) == ("persist for checkpoint 1 of log log failed: 1 of 2 change sets not "
                          "durable (first: sequence number #0: producing to t[0] failed: "
                          "_MSG_TIMED_OUT)")
    assert error.__cause__ is cause
    writer.close()


def test_a_persist_of_durable_sets_gives_their_handle() -> None:
    writer = HeldUploads()
    two_sets(writer)
    persisted = writer.persist(writer.initial_sequence_number(), 1)
    for change_set, future in writer.uploads:
        future.set_result(change_set)
    assert persisted.exception() is None
    handle = persisted.result(0).job_owned
    assert handle is not None
    assert [cs.payloads for cs in handle.change_sets] == [[b"a"], [b"b"]]
    writer.close()
