"""Admin calls that survive leader changes and freshly created topics.

Every admin call of the library goes through :func:`retry_call` (any call) or
:func:`admin_futures` (calls answering with one future per topic, partition or
resource). Transient errors (:func:`~kafka_changelog.kafka.error_text.is_retriable`:
a dead or moved leader, a stale leader epoch, a topic not every broker knows
yet, a timeout, a dropped connection) are retried with growing pauses until
the time bound; access errors and other errors are raised at once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from ..errors import ChangelogError
from .error_text import access_error, describe, is_access_error, is_retriable

T = TypeVar("T")
K = TypeVar("K")

log = logging.getLogger(__name__)

#: First pause between attempts, doubled after each until :data:`MAX_BACKOFF_S`.
INITIAL_BACKOFF_S = 0.1
MAX_BACKOFF_S = 1.0
#: One attempt may use at most this share of the whole bound, so a request stuck
#: on a dead leader leaves time for attempts against the new one.
ATTEMPT_SHARE = 1 / 3
#: An attempt is never given less than this many seconds.
MIN_ATTEMPT_S = 2.0
#: Extra wait for a future beyond its request's own timeout (librdkafka fails the
#: request itself at its timeout; this only guards against a future never completing).
FUTURE_GRACE_S = 5.0


class NotReady(Exception):
    """Raised by an attempt whose answer is not usable yet (retried like a transient error).

    The message says what is missing, e.g. "partition 3 has no leader"; it ends
    up in the final error when the bound passes.
    """


def backoff_delays(initial: float = INITIAL_BACKOFF_S,
                   maximum: float = MAX_BACKOFF_S) -> Callable[[], float]:
    """A function returning the next pause: ``initial``, doubled per call, capped at ``maximum``."""
    state = [initial / 2]

    def next_delay() -> float:
        state[0] = min(maximum, state[0] * 2)
        return state[0]

    return next_delay


def attempt_budget(remaining_s: float, timeout_s: float) -> float:
    """Seconds one attempt may take: a share of the bound, within what remains of it."""
    return max(MIN_ATTEMPT_S, min(remaining_s, timeout_s * ATTEMPT_SHARE))


def kafka_error_of(exc: KafkaException) -> KafkaError | None:
    """The :class:`KafkaError` a :class:`KafkaException` carries (None if it carries none)."""
    first = exc.args[0] if exc.args else None
    return first if isinstance(first, KafkaError) else None


def _transient(error: KafkaError, transient_codes: Collection[int]) -> bool:
    """Whether a later attempt may not meet ``error``: the shared rules, or a code the
    call declared transient for itself."""
    return is_retriable(error) or error.code() in transient_codes


def retry_call(
    what: str,
    attempt: Callable[[float], T],
    timeout_s: float,
    *,
    error_type: Callable[[str], Exception] = ChangelogError,
    refresh: Callable[[], object] | None = None,
    transient_codes: Collection[int] = (),
) -> T:
    """Run ``attempt(budget_s)`` until it returns, retrying transient failures up to ``timeout_s``.

    ``what`` names the call and its topic ("list offsets of topic T"): errors read
    ``cannot <what>: <error>``. ``attempt`` gets the seconds it may use and raises
    :class:`KafkaException` or :class:`NotReady`. Access errors raise
    :class:`KafkaAccessError` at once, other non-retriable errors ``error_type``
    at once; when transient failures outlast ``timeout_s``, ``error_type`` names
    the attempts and the last error. ``refresh`` runs before every retry (e.g. to
    reload the topic's metadata so the next attempt asks the new leader).
    ``transient_codes`` are retried for this call only, beyond what
    :func:`~kafka_changelog.kafka.error_text.is_retriable` says (an error code that
    is transient for one request but final for others).
    """
    started = time.monotonic()
    deadline = started + timeout_s
    next_delay = backoff_delays()
    attempts = 0
    cause: Exception
    while True:
        attempts += 1
        try:
            return attempt(attempt_budget(deadline - time.monotonic(), timeout_s))
        except KafkaException as exc:
            error = kafka_error_of(exc)
            if error is None:
                raise error_type(f"cannot {what}: {exc}") from exc
            if is_access_error(error):
                raise access_error(error, f"trying to {what}") from exc
            if not _transient(error, transient_codes):
                raise error_type(f"cannot {what}: {describe(error)}") from exc
            last, cause = describe(error), exc
        except NotReady as exc:
            last, cause = str(exc), exc
        except concurrent.futures.TimeoutError as exc:
            last, cause = "no answer (the request's future did not complete)", exc
        delay = next_delay()
        if time.monotonic() + delay > deadline:
            elapsed = time.monotonic() - started
            raise error_type(
                f"cannot {what}: still failing after {attempts} attempts in {elapsed:.1f} s "
                f"(bound {timeout_s:g} s); last error: {last}"
            ) from cause
        log.debug("retrying (attempt %d) to %s in %.1f s: %s", attempts + 1, what, delay, last)
        time.sleep(delay)
        if refresh is not None:
            with contextlib.suppress(KafkaException):  # the next attempt reports what is wrong
                refresh()


def admin_futures(
    what: str,
    request: Callable[[float], Mapping[K, concurrent.futures.Future[Any]]],
    timeout_s: float,
    *,
    error_type: Callable[[str], Exception] = ChangelogError,
    refresh: Callable[[], object] | None = None,
    done_on: Collection[int] = (),
    check: Callable[[K, Any], str | None] | None = None,
    transient_codes: Collection[int] = (),
) -> dict[K, Any]:
    """Issue ``request(request_timeout_s)``, wait for all its futures; retry as :func:`retry_call`.

    A retry re-issues the whole request, so it must be idempotent (listing
    offsets, deleting below an offset, describing, creating a topic with
    ``TOPIC_ALREADY_EXISTS`` in ``done_on``). A future failing with a code in
    ``done_on`` counts as done with result None. If some futures fail for good
    and others transiently, the one failing for good is raised. ``check(key,
    result)`` returns why a result is not an answer yet (None if it is): e.g. an
    offset of -1001 that librdkafka reports without an error while a leader moves;
    such a result is retried like a transient error. ``transient_codes`` as in
    :func:`retry_call`.
    """

    def attempt(budget: float) -> dict[K, Any]:
        futures = request(budget)
        results: dict[K, Any] = {}
        transient: KafkaException | None = None
        for key, future in futures.items():
            try:
                results[key] = future.result(timeout=budget + FUTURE_GRACE_S)
            except KafkaException as exc:
                error = kafka_error_of(exc)
                if error is not None and error.code() in done_on:
                    results[key] = None
                elif error is None or not _transient(error, transient_codes):
                    raise
                elif transient is None:
                    transient = exc
        if transient is not None:
            raise transient
        if check is not None:
            for key, result in results.items():
                reason = check(key, result)
                if reason is not None:
                    raise NotReady(reason)
        return results

    return retry_call(what, attempt, timeout_s, error_type=error_type, refresh=refresh,
                      transient_codes=transient_codes)
