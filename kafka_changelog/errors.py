"""One exception hierarchy for everything the changelog raises.

Every error names what was wrong (key group, range, sequence numbers, topic,
partition, offset, expected vs found) so that a log line alone is enough to act on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .keygroups import KeyGroupRange


class ChangelogError(Exception):
    """Base class of every error raised by kafka-changelog."""


class KeyGroupOutOfRangeError(ChangelogError, ValueError):
    """A change was appended for a key group the writer does not own."""

    def __init__(self, key_group: int, key_group_range: KeyGroupRange, log_id: str = "") -> None:
        self.key_group = key_group
        self.key_group_range = key_group_range
        who = f"writer {log_id} " if log_id else "writer "
        super().__init__(
            f"key group {key_group} is outside the {who}key-group range {key_group_range}"
        )


class WriterClosedError(ChangelogError, RuntimeError):
    """An operation needs an open writer but the writer was closed."""

    def __init__(self, log_id: str, operation: str) -> None:
        self.log_id = log_id
        self.operation = operation
        super().__init__(f"cannot {operation}: changelog writer {log_id} is closed")


class PersistError(ChangelogError):
    """A persist could not make all of its change sets durable (the cause is chained)."""


class UnknownStorageError(ChangelogError, LookupError):
    """No changelog storage is registered under the requested name."""

    def __init__(self, name: str, available: Iterable[str]) -> None:
        self.name = name
        self.available = sorted(available)
        names = ", ".join(self.available) or "(none installed)"
        super().__init__(
            f"no changelog storage named {name!r}; available storages "
            f"(entry-point group 'kafka_changelog.storages'): {names}"
        )


class StorageLoadError(ChangelogError, ImportError):
    """A storage entry point exists but could not be imported or built."""


class HandleFormatError(ChangelogError, ValueError):
    """Serialised handle bytes could not be decoded."""


class ChangelogTruncatedError(ChangelogError):
    """The log a handle needs was deleted: restoring would give a shorter state."""

    def __init__(
        self, topic: str, partition: int, needed_offset: int, log_start_offset: int
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.needed_offset = needed_offset
        self.log_start_offset = log_start_offset
        super().__init__(
            f"changelog {topic}[{partition}] was truncated: the handle needs offset "
            f"{needed_offset} but the log starts at offset {log_start_offset}"
        )


class RecordDecodeError(ChangelogError):
    """A changelog record could not be decoded."""

    def __init__(self, topic: str, partition: int, offset: int, reason: str) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        super().__init__(
            f"cannot decode changelog record {topic}[{partition}]@{offset}: {reason}"
        )


class BackpressureTimeoutError(ChangelogError, TimeoutError):
    """Appends waited too long for in-flight bytes to be acknowledged."""


class TopicConfigError(ChangelogError):
    """A topic exists with settings the changelog cannot work with."""


class KafkaConnectionError(ChangelogError):
    """A client could not reach Kafka, or Kafka did not accept it. The subclasses say which
    cause (retrying with the same settings does not help any of them but the first)."""


class KafkaUnreachableError(KafkaConnectionError):
    """No broker answered at the configured addresses (refused, timed out, unknown host),
    or none answered in the protocol the client speaks."""


class KafkaTlsError(KafkaConnectionError):
    """The TLS handshake with a broker failed."""


class UntrustedBrokerCertificateError(KafkaTlsError):
    """The broker's certificate is not signed by an authority the client trusts
    (``ssl.ca.location`` / ``ssl.ca.pem``, else the system's)."""


class BrokerHostnameMismatchError(KafkaTlsError):
    """The broker's certificate is trusted but does not name the host the client connected
    to (``ssl.endpoint.identification.algorithm=https``)."""


class ClientCertificateRejectedError(KafkaTlsError):
    """The broker requires a client certificate and refused the one given (or none)."""


class KafkaAccessError(KafkaConnectionError):
    """The broker refused the client's credentials or an operation (authentication,
    authorization)."""


class KafkaAuthenticationError(KafkaAccessError):
    """SASL authentication failed: user, password or mechanism."""


class KafkaAuthorizationError(KafkaAccessError):
    """The principal lacks an ACL: ``operation`` on ``resource_type`` ``resource``
    (``resource`` is empty where Kafka does not say which one)."""

    def __init__(self, message: str, *, operation: str = "", resource_type: str = "",
                 resource: str = "") -> None:
        self.operation = operation
        self.resource_type = resource_type
        self.resource = resource
        super().__init__(message)
