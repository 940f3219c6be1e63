"""kafka-changelog: a durable state changelog for stream processing, kept in Apache Kafka.

The core API follows Apache Flink's state changelog (DSTL): writers append state
changes for a key-group range, ``persist`` makes them durable and returns a
handle, and ``confirm``/``reset``/``truncate`` manage what checkpoints still need.
"""

from typing import TYPE_CHECKING

from .errors import (
    BackpressureTimeoutError,
    BrokerHostnameMismatchError,
    ChangelogError,
    ChangelogTruncatedError,
    ClientCertificateRejectedError,
    HandleFormatError,
    KafkaAccessError,
    KafkaAuthenticationError,
    KafkaAuthorizationError,
    KafkaConnectionError,
    KafkaTlsError,
    KafkaUnreachableError,
    KeyGroupOutOfRangeError,
    PersistError,
    RecordDecodeError,
    StorageLoadError,
    TopicConfigError,
    UnknownStorageError,
    UntrustedBrokerCertificateError,
    WriterClosedError,
)
from .lazy_exports import install as _install_lazy_exports
from .moved_modules import install as _install_moved_modules

if TYPE_CHECKING:  # imported when first read (lazy_exports.py)
    from .buffering_writer import BufferingChangelogWriter
    from .change import META_KEY_GROUP, StateChange
    from .change_set import ChangeSet
    from .handle import ChangelogHandle
    from .keygroups import (
        KeyGroupRange,
        key_group_for_key,
        key_group_range_for_operator,
        operator_index_for_key_group,
    )
    from .memory import InMemoryChangelogHandle, InMemoryChangelogStorage, InMemoryChangelogWriter
    from .registry import ChangelogRegistry
    from .sequence import (
        MAX_SEQUENCE_NUMBER,
        SequenceNumber,
        SequenceNumberOutOfRangeError,
        SequenceNumberOverflowError,
    )
    from .storage import StateChangelogStorage, available_storages, load_storage
    from .writer import SnapshotResult, StateChangelogWriter

__version__ = "0.2.0"

__all__ = [
    "MAX_SEQUENCE_NUMBER",
    "META_KEY_GROUP",
    "BackpressureTimeoutError",
    "BrokerHostnameMismatchError",
    "BufferingChangelogWriter",
    "ChangeSet",
    "ChangelogError",
    "ChangelogHandle",
    "ChangelogRegistry",
    "ChangelogTruncatedError",
    "ClientCertificateRejectedError",
    "HandleFormatError",
    "InMemoryChangelogHandle",
    "InMemoryChangelogStorage",
    "InMemoryChangelogWriter",
    "KafkaAccessError",
    "KafkaAuthenticationError",
    "KafkaAuthorizationError",
    "KafkaConnectionError",
    "KafkaTlsError",
    "KafkaUnreachableError",
    "KeyGroupOutOfRangeError",
    "KeyGroupRange",
    "PersistError",
    "RecordDecodeError",
    "SequenceNumber",
    "SequenceNumberOutOfRangeError",
    "SequenceNumberOverflowError",
    "SnapshotResult",
    "StateChange",
    "StateChangelogStorage",
    "StateChangelogWriter",
    "StorageLoadError",
    "TopicConfigError",
    "UnknownStorageError",
    "UntrustedBrokerCertificateError",
    "WriterClosedError",
    "available_storages",
    "key_group_for_key",
    "key_group_range_for_operator",
    "load_storage",
    "operator_index_for_key_group",
]

# Module paths from before the packages were regrouped keep importing (moved_modules.py).
_install_moved_modules()

_install_lazy_exports(globals())
