"""Which Kafka errors are retried, and how the retry helper bounds and reports them.

Pure logic: the attempts below are plain functions raising the errors a Kafka
call would raise; what brokers really answer is covered by the broker tests
(tests/broker/test_gc_leader_change.py, tests/broker/test_topic_creation.py).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import DeletedRecords, ListOffsetsResultInfo, OffsetSpec

from kafka_changelog.errors import ChangelogError, KafkaAuthorizationError, TopicConfigError
from kafka_changelog.kafka import KafkaChangelogConfig
from kafka_changelog.kafka.admin_retry import (
    NotReady,
    admin_futures,
    attempt_budget,
    backoff_delays,
    retry_call,
)
from kafka_changelog.kafka.error_text import is_retriable
from kafka_changelog.kafka.offsets import delete_below, list_offsets


def failing(code: int, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, "test", **flags))


@pytest.mark.parametrize("code", [
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.NOT_CONTROLLER,
])
def test_leader_changes_timeouts_and_young_topics_are_retriable(code: int) -> None:
    assert is_retriable(KafkaError(code))


@pytest.mark.parametrize("code", [
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.INVALID_REPLICATION_FACTOR,
    KafkaError.POLICY_VIOLATION,
    KafkaError.INVALID_CONFIG,
])
def test_access_and_request_errors_are_not(code: int) -> None:
    assert not is_retriable(KafkaError(code))


def test_librdkafka_flags_count_but_never_for_access_or_fatal_errors() -> None:
    assert is_retriable(KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, retriable=True))
    assert not is_retriable(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, retriable=True))
    assert not is_retriable(KafkaError(KafkaError._TRANSPORT, fatal=True))


def test_backoff_doubles_up_to_its_cap() -> None:
    delay = backoff_delays(0.1, 1.0)
    assert [round(delay(), 3) for _ in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_one_attempt_gets_a_share_of_the_bound() -> None:
    assert attempt_budget(30.0, 30.0) == 10.0
    assert attempt_budget(4.0, 30.0) == 4.0
    assert attempt_budget(0.1, 30.0) == 2.0  # never less than a usable moment


def test_transient_errors_are_retried_with_a_refresh_in_between() -> None:
    errors = [failing(KafkaError.FENCED_LEADER_EPOCH), failing(KafkaError._TRANSPORT)]
    refreshed: list[int] = []

    def attempt(budget: float) -> str:
        assert budget > 0
        if errors:
            raise errors.pop(0)
        return "done"

    assert retry_call("list offsets of t", attempt, 10.0,
                      refresh=lambda: refreshed.append(1)) == "done"
    assert refreshed == [1, 1]


def test_a_non_retriable_error_is_raised_at_once_with_the_call_named() -> None:
    calls: list[float] = []

    def attempt(budget: float) -> None:
        calls.append(budget)
        raise failing(KafkaError.INVALID_REPLICATION_FACTOR)

    with pytest.raises(TopicConfigError,
                       match=r"^cannot create topic t: INVALID_REPLICATION_FACTOR"):
        retry_call("create topic t", attempt, 10.0, error_type=TopicConfigError)
    assert len(calls) == 1


def test_an_access_error_is_a_kafka_access_error_at_once() -> None:
    calls: list[float] = []

    def attempt(budget: float) -> None:
        calls.append(budget)
        raise failing(KafkaError.TOPIC_AUTHORIZATION_FAILED)

    with pytest.raises(KafkaAuthorizationError, match=r"^trying to delete records of t failed: "
                       r"the principal lacks an ACL on Topic \(TOPIC_AUTHORIZATION_FAILED"):
        retry_call("delete records of t", attempt, 10.0)
    assert len(calls) == 1


def test_transient_errors_past_the_bound_name_call_attempts_and_last_error() -> None:
    started = time.monotonic()

    def attempt(budget: float) -> None:
        raise failing(KafkaError.NOT_LEADER_FOR_PARTITION)

    with pytest.raises(ChangelogError) as caught:
        retry_call("list offsets of t (ListOffsets)", attempt, 0.5)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert message.startswith("cannot list offsets of t (ListOffsets): still failing after ")
    assert "attempts" in message and "NOT_LEADER_FOR_PARTITION" in message


def test_not_ready_is_retried_and_reported() -> None:
    def attempt(budget: float) -> None:
        raise NotReady("partitions [2] have no leader")

    with pytest.raises(TopicConfigError, match=r"last error: partitions \[2\] have no leader"):
        retry_call("read the metadata of topic t", attempt, 0.3, error_type=TopicConfigError)


def _future(result: Any = None, error: KafkaException | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
    return future


def test_admin_futures_retries_the_whole_request_and_checks_answers() -> None:
    answers = [
        {"a": _future(1), "b": _future(error=failing(KafkaError.UNKNOWN_TOPIC_OR_PART))},
        {"a": _future(1), "b": _future(-1001)},  # no error, but no answer either
        {"a": _future(1), "b": _future(2)},
    ]

    def request(budget: float) -> dict[str, Future[Any]]:
        return answers.pop(0)

    result = admin_futures("list offsets of t", request, 10.0,
                           check=lambda key, value: "no offset" if value < 0 else None)
    assert result == {"a": 1, "b": 2} and not answers


def test_admin_futures_counts_done_on_codes_as_done() -> None:
    def request(budget: float) -> dict[str, Future[Any]]:
        return {"t": _future(error=failing(KafkaError.TOPIC_ALREADY_EXISTS))}

    assert admin_futures("create topic t", request, 1.0,
                         done_on={KafkaError.TOPIC_ALREADY_EXISTS}) == {"t": None}


def test_admin_futures_raises_a_permanent_failure_over_a_transient_one() -> None:
    def request(budget: float) -> dict[str, Future[Any]]:
        return {"a": _future(error=failing(KafkaError._TRANSPORT)),
                "b": _future(error=failing(KafkaError.POLICY_VIOLATION))}

    with pytest.raises(ChangelogError, match="POLICY_VIOLATION"):
        admin_futures("delete records of t", request, 10.0)


def _no_leaders_found() -> KafkaException:
    # What librdkafka answers for every partition of a ListOffsets or DeleteRecords
    # request while none of them has a leader in its metadata.
    return KafkaException(KafkaError(
        KafkaError._NOENT, "Failed to query partition leaders: No leaders found"))


class _LeaderlessAtFirst:
    """An admin client whose partitions get their leaders after ``leaderless`` requests."""

    def __init__(self, leaderless: int) -> None:
        self.leaderless = leaderless
        self.requests = 0
        self.refreshes = 0

    def _answer(self, request: Any, value: Any) -> dict[Any, Future[Any]]:
        self.requests += 1
        if self.requests <= self.leaderless:
            return {tp: _future(error=_no_leaders_found()) for tp in request}
        return {tp: _future(value(tp)) for tp in request}

    def list_offsets(self, request: Any, request_timeout: float) -> dict[Any, Future[Any]]:
        return self._answer(request, lambda tp: ListOffsetsResultInfo(100 + tp.partition, -1, 0))

    def delete_records(self, request: Any, request_timeout: float) -> dict[Any, Future[Any]]:
        return self._answer(request, lambda tp: DeletedRecords(tp.offset))

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshes += 1


def test_list_offsets_waits_for_a_young_replicated_topic_to_get_its_leaders() -> None:
    admin = _LeaderlessAtFirst(leaderless=2)
    offsets = list_offsets(admin, "changelog", 3, OffsetSpec.latest(), 10.0)  # type: ignore[arg-type]
    assert offsets == {0: 100, 1: 101, 2: 102}
    assert admin.requests == 3 and admin.refreshes == 2


def test_delete_below_waits_for_leaders_too() -> None:
    admin = _LeaderlessAtFirst(leaderless=1)
    assert delete_below(admin, "changelog", {0: 7, 2: 9}, 10.0) == {0: 7, 2: 9}  # type: ignore[arg-type]
    assert admin.requests == 2


def test_leaderless_partitions_past_the_bound_name_the_topic_and_the_error() -> None:
    admin = _LeaderlessAtFirst(leaderless=10_000)
    with pytest.raises(ChangelogError, match=r"cannot list offsets of changelog \(ListOffsets\): "
                       r"still failing after \d+ attempts.*No leaders found"):
        list_offsets(admin, "changelog", 1, OffsetSpec.earliest(), 0.5)  # type: ignore[arg-type]


def test_noent_stays_final_where_it_means_not_found() -> None:
    assert not is_retriable(KafkaError(KafkaError._NOENT))

    def request(budget: float) -> dict[str, Future[Any]]:
        return {"t": _future(error=_no_leaders_found())}

    with pytest.raises(ChangelogError, match="_NOENT"):
        admin_futures("describe t", request, 10.0)


def test_a_finite_retention_for_the_changelog_topic_is_refused_at_config_time() -> None:
    with pytest.raises(ValueError, match="retention_ms must be -1"):
        KafkaChangelogConfig(bootstrap_servers="localhost:9092", retention_ms=86_400_000)
    assert KafkaChangelogConfig(bootstrap_servers="localhost:9092", retention_ms=-1)
