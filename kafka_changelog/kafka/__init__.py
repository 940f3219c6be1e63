"""The Kafka changelog storage (registered as ``kafka``)."""

from .config import KafkaChangelogConfig
from .handle import KafkaChangelogHandle, PartitionRange
from .reader import KafkaChangelogReader
from .storage import KafkaChangelogStorage
from .writer import KafkaChangelogWriter, KafkaLocation

__all__ = [
    "KafkaChangelogConfig",
    "KafkaChangelogHandle",
    "KafkaChangelogReader",
    "KafkaChangelogStorage",
    "KafkaChangelogWriter",
    "KafkaLocation",
    "PartitionRange",
]
