"""Driver-side planning of ``format("kafka-changelog")``: options, checkpoint, input partitions.

Pure Python (no pyspark), so it can be unit tested: :func:`parse_options` checks
the reader options, :func:`load_checkpoint` picks the checkpoint from the
checkpoint topic (read-only), and :func:`plan_changes` / :func:`plan_state` cut
it into picklable tasks, one per Spark input partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka_changelog.errors import ChangelogError
from kafka_changelog.kafka.access import connect_admin
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointView
from kafka_changelog.kafka.client_settings import KafkaConnection
from kafka_changelog.kafka.config import KafkaChangelogConfig
from kafka_changelog.kafka.handle import KafkaChangelogHandle
from kafka_changelog.kafka.snapshot_store import SnapshotStoreConfig
from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.keys import recorded_key_types
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint, KeyedStateHandle
from kafka_changelog.state.checkpoints.checkpoint_store import CheckpointStore
from kafka_changelog.state.checkpoints.time_properties import (
    PROCESSING_TIME_PROPERTY,
    recorded_time,
)
from kafka_changelog.state.errors import CheckpointNotFoundError, CheckpointStoreError

from .scan import OffsetSlice

#: The format name: ``spark.read.format(FORMAT)``.
FORMAT = "kafka-changelog"

MODE_CHANGES = "changes"
MODE_STATE = "state"
MODE_TIMERS = "timers"
MODES = (MODE_CHANGES, MODE_STATE, MODE_TIMERS)

DEFAULT_CHANGELOG_TOPIC = "kafka-changelog"
DEFAULT_SNAPSHOT_TOPIC = "kafka-changelog-snapshots"
DEFAULT_CHECKPOINT_TOPIC = "kafka-changelog-checkpoints"
DEFAULT_SLICE_OFFSETS = 200_000
DEFAULT_SLICE_KEY_GROUPS = 16

#: Prefix of options passed to every Kafka client (``kafka.bootstrap.servers``, ...).
KAFKA_PREFIX = "kafka."

#: Options of the reader (Spark lower-cases option names; so does :func:`parse_options`),
#: with what each means (used in error messages).
OPTIONS: dict[str, str] = {
    "kafka.bootstrap.servers": "brokers (required); any other kafka.<librdkafka setting> "
                               "passes through to every client",
    "application": "the application whose checkpoint is read (required)",
    "operator": "one operator id (default: every operator of the checkpoint)",
    "checkpoint": "checkpoint id (default: the latest complete one)",
    "mode": "'changes' (default), 'state' or 'timers' (the registered timers, decoded)",
    "changelog.topic": "changelog topic (default: the one the checkpoint's handles name)",
    "snapshot.topic": "snapshot topic (default: the one the checkpoint's handles name)",
    "checkpoint.topic": f"checkpoint topic (default {DEFAULT_CHECKPOINT_TOPIC})",
    "slice.offsets": f"max offsets per input partition in changes mode "
                     f"(default {DEFAULT_SLICE_OFFSETS})",
    "slice.keygroups": f"key groups per input partition in modes state and timers "
                       f"(default {DEFAULT_SLICE_KEY_GROUPS})",
    "pushdown": "'true': filters on key, key_decoded and key_group read only their key "
                "groups (default 'false'; see docs/reading.md, 'Key lookups')",
    "minpartitions": "changes mode: input partitions are a multiple of this (default: the "
                     "session's parallelism when registered with register(spark), else one "
                     "per slice)",
}

#: Options Spark itself may pass along (``load(path)``); ignored.
_IGNORED = frozenset({"path"})


class ReaderOptionError(ChangelogError, ValueError):
    """An option of ``format("kafka-changelog")`` is missing or wrong."""


class CheckpointSelectionError(CheckpointStoreError, LookupError):
    """The requested application, checkpoint or operator is not in the checkpoint topic."""


class UnreadableCheckpointError(ChangelogError):
    """The checkpoint refers to data the Spark reader cannot read (wrong topic, kind)."""


@dataclass(frozen=True)
class ReaderOptions:
    """The parsed options of one read (picklable: workers get a copy)."""

    bootstrap_servers: str
    application: str
    #: librdkafka settings for every client besides ``bootstrap.servers``.
    client_config: dict[str, str] = field(default_factory=dict)
    operator: str | None = None
    checkpoint_id: int | None = None
    mode: str = MODE_CHANGES
    #: The changelog and snapshot topics the checkpoint must use (None: whichever its
    #: handles name; each handle names its topic).
    changelog_topic: str | None = None
    snapshot_topic: str | None = None
    checkpoint_topic: str = DEFAULT_CHECKPOINT_TOPIC
    slice_offsets: int = DEFAULT_SLICE_OFFSETS
    slice_key_groups: int = DEFAULT_SLICE_KEY_GROUPS
    #: Mode ``changes``: slices are packed into a multiple of this many input partitions
    #: (None: one input partition per slice).
    min_partitions: int | None = None
    #: Seconds for admin requests and for reads to make progress.
    request_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise ReaderOptionError("option kafka.bootstrap.servers must name at least one broker")
        if not self.application:
            raise ReaderOptionError("option application must not be empty")
        if self.mode not in MODES:
            raise ReaderOptionError(
                f"option mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.slice_offsets < 1:
            raise ReaderOptionError(f"option slice.offsets must be >= 1, got {self.slice_offsets}")
        if self.slice_key_groups < 1:
            raise ReaderOptionError(
                f"option slice.keyGroups must be >= 1, got {self.slice_key_groups}")
        if self.min_partitions is not None and self.min_partitions < 1:
            raise ReaderOptionError(
                f"option minPartitions must be >= 1, got {self.min_partitions}")
        if self.checkpoint_id is not None and self.checkpoint_id < 0:
            raise ReaderOptionError(f"option checkpoint must be >= 0, got {self.checkpoint_id}")

    def connection(self) -> KafkaConnection:
        """How every client of the reader connects (security included)."""
        return KafkaConnection(bootstrap_servers=self.bootstrap_servers,
                               request_timeout_s=self.request_timeout_s,
                               client_config=dict(self.client_config))

    def client_settings(self) -> dict[str, Any]:
        """librdkafka settings every client starts from (security included)."""
        return self.connection().common()

    def changelog_config(self, max_parallelism: int = 128) -> KafkaChangelogConfig:
        """Config of changelog readers (consumer settings only are used: each handle
        names its topic)."""
        return KafkaChangelogConfig.on(
            self.connection(), topic=self.changelog_topic or DEFAULT_CHANGELOG_TOPIC,
            max_parallelism=max_parallelism)

    def snapshot_config(self, max_parallelism: int = 128, topic: str | None = None
                        ) -> SnapshotStoreConfig:
        """Config of snapshot chunk readers of ``topic`` (default: the option's)."""
        return SnapshotStoreConfig.on(
            self.connection(), topic=topic or self.snapshot_topic or DEFAULT_SNAPSHOT_TOPIC,
            max_parallelism=max_parallelism)

    def checkpoint_config(self) -> CheckpointStoreConfig:
        """Config of the checkpoint topic reader."""
        return CheckpointStoreConfig.on(self.connection(), topic=self.checkpoint_topic)


def _int_option(options: Mapping[str, str], name: str, shown: str, default: int) -> int:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ReaderOptionError(f"option {shown} must be an integer, got {raw!r}") from None


def parse_options(options: Mapping[str, str]) -> ReaderOptions:
    """Check and parse the options (names are case-insensitive, values strings).

    Raises :class:`ReaderOptionError` naming the option for a missing required
    option, a bad value, or an unknown option name.
    """
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    client = {k[len(KAFKA_PREFIX):]: v for k, v in lowered.items() if k.startswith(KAFKA_PREFIX)}
    servers = client.pop("bootstrap.servers", "").strip()
    unknown = sorted(k for k in lowered
                     if not k.startswith(KAFKA_PREFIX) and k not in OPTIONS and k not in _IGNORED)
    if unknown:
        known = ", ".join(["kafka.<librdkafka setting>", *(k for k in OPTIONS
                                                         if not k.startswith(KAFKA_PREFIX))])
        raise ReaderOptionError(
            f"unknown option(s) {', '.join(unknown)} for format('{FORMAT}'); known options: "
            f"{known}")
    if not servers:
        raise ReaderOptionError(
            f"format('{FORMAT}') needs the option kafka.bootstrap.servers (host:port[,...])")
    application = lowered.get("application", "").strip()
    if not application:
        raise ReaderOptionError(
            f"format('{FORMAT}') needs the option application (the application id its "
            "checkpoints were committed under)")
    checkpoint_raw = lowered.get("checkpoint", "").strip()
    checkpoint_id: int | None = None
    if checkpoint_raw and checkpoint_raw.lower() != "latest":
        try:
            checkpoint_id = int(checkpoint_raw)
        except ValueError:
            raise ReaderOptionError(
                f"option checkpoint must be a checkpoint id (an integer) or 'latest', got "
                f"{checkpoint_raw!r}") from None
    mode = lowered.get("mode", MODE_CHANGES).strip().lower() or MODE_CHANGES
    operator = lowered.get("operator", "").strip() or None
    return ReaderOptions(
        bootstrap_servers=servers,
        application=application,
        client_config=client,
        operator=operator,
        checkpoint_id=checkpoint_id,
        mode=mode,
        changelog_topic=lowered.get("changelog.topic", "").strip() or None,
        snapshot_topic=lowered.get("snapshot.topic", "").strip() or None,
        checkpoint_topic=lowered.get("checkpoint.topic", "").strip() or DEFAULT_CHECKPOINT_TOPIC,
        slice_offsets=_int_option(lowered, "slice.offsets", "slice.offsets",
                                  DEFAULT_SLICE_OFFSETS),
        slice_key_groups=_int_option(lowered, "slice.keygroups", "slice.keyGroups",
                                     DEFAULT_SLICE_KEY_GROUPS),
        min_partitions=(_int_option(lowered, "minpartitions", "minPartitions", 1)
                        if lowered.get("minpartitions", "").strip() else None),
    )


# -- the checkpoint ------------------------------------------------------------------------------


def existing_topics(options: ReaderOptions) -> set[str]:
    """Names of the topics the brokers show (``KafkaAccessError`` if they refuse or are away)."""
    admin, metadata = connect_admin(options.client_settings(), options.request_timeout_s)
    del admin
    return set(metadata.topics)


def _shown(names: Iterable[object], limit: int = 20) -> str:
    ordered = sorted(str(n) for n in names)
    if not ordered:
        return "none"
    more = f" (and {len(ordered) - limit} more)" if len(ordered) > limit else ""
    return ", ".join(ordered[:limit]) + more


def select_checkpoint(store: CheckpointStore, application: str,
                      checkpoint_id: int | None, topic: str) -> CompletedCheckpoint:
    """The requested checkpoint (latest when ``checkpoint_id`` is None) of ``application``.

    Raises :class:`CheckpointSelectionError` naming the application, the ids the
    topic holds for it, or, for an unknown application, the applications it knows.
    """
    ids = store.checkpoint_ids(application)
    if not ids:
        raise CheckpointSelectionError(
            f"application {application!r} has no checkpoint in checkpoint topic {topic} "
            f"(options application, checkpoint.topic); applications with checkpoints there: "
            f"{_shown(store.applications())}")
    if checkpoint_id is None:
        latest = store.latest(application)
        if latest is None:  # ids without a pointer cannot happen; be explicit anyway
            raise CheckpointSelectionError(
                f"application {application!r} has no latest checkpoint in {topic}")
        return latest
    try:
        return store.get(application, checkpoint_id)
    except CheckpointNotFoundError as exc:
        raise CheckpointSelectionError(
            f"application {application!r} has no checkpoint {checkpoint_id} in checkpoint "
            f"topic {topic} (option checkpoint); retained checkpoint ids: {_shown(ids)}"
        ) from exc


def load_checkpoint(options: ReaderOptions,
                    topics: set[str] | None = None) -> CompletedCheckpoint:
    """Read the checkpoint topic (read-only) and pick the checkpoint the options ask for."""
    found = existing_topics(options) if topics is None else topics
    if options.checkpoint_topic not in found:
        raise CheckpointSelectionError(
            f"checkpoint topic {options.checkpoint_topic!r} does not exist on "
            f"{options.bootstrap_servers} (option checkpoint.topic); topics there: "
            f"{_shown(t for t in found if not t.startswith('__'))}")
    with KafkaCheckpointView(options.checkpoint_config()) as store:
        return select_checkpoint(store, options.application, options.checkpoint_id,
                                 options.checkpoint_topic)


def select_operators(checkpoint: CompletedCheckpoint, operator: str | None) -> list[str]:
    """The operators to read: ``operator`` if given (it must be in the checkpoint), else all."""
    known = checkpoint.operators()
    if operator is None:
        return known
    if operator not in known:
        raise CheckpointSelectionError(
            f"checkpoint {checkpoint.checkpoint_id} of application {checkpoint.application!r} "
            f"has no operator {operator!r} (option operator); its operators: {_shown(known)}")
    return [operator]


# -- tasks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChangesTask:
    """Mode ``changes``: one offset slice of one changelog handle of one subtask."""

    operator: str
    subtask: int
    slice: OffsetSlice
    #: The key column types the checkpoint records (None: not recorded): ``key_decoded``.
    key_types: tuple[str, ...] | None = None
    #: The slice's share of its range's record bytes (what packing slices weighs).
    estimated_bytes: int = 0


@dataclass(frozen=True)
class StateTask:
    """Modes ``state`` and ``timers``: the key groups ``key_groups`` of one subtask's keyed
    state (``timers``: its timers, else its states' entries).

    ``handle`` is the subtask's handle narrowed to ``key_groups``.
    """

    operator: str
    subtask: int
    key_groups: KeyGroupRange
    handle: KeyedStateHandle
    #: The key column types the checkpoint records (None: not recorded): ``key_decoded``.
    key_types: tuple[str, ...] | None = None
    #: The checkpoint's processing time (ms since the epoch; None: not recorded): TTL'd
    #: entries expired then are not shown.
    at_ms: int | None = None
    #: Mode ``timers``: rows of the registered timers instead of the states' entries.
    timers: bool = False


@dataclass(frozen=True)
class ReadPlan:
    """What one read does: the checkpoint chosen and one task per input partition."""

    application: str
    checkpoint_id: int
    mode: str
    max_parallelism: int
    operators: tuple[str, ...]
    tasks: tuple[ChangesTask | StateTask, ...]


def split_offsets(start: int, end: int, max_offsets: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into consecutive pieces of at most ``max_offsets`` offsets."""
    if max_offsets < 1:
        raise ValueError(f"max_offsets must be >= 1, got {max_offsets}")
    return [(s, min(s + max_offsets, end)) for s in range(start, end, max_offsets)]


def split_key_groups(key_groups: KeyGroupRange, size: int) -> list[KeyGroupRange]:
    """``key_groups`` cut into consecutive ranges of at most ``size`` key groups."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return [KeyGroupRange(s, min(s + size - 1, key_groups.end))
            for s in range(key_groups.start, key_groups.end + 1, size)]


def _kafka_handles(checkpoint: CompletedCheckpoint, operator: str, subtask: int,
                   keyed: KeyedStateHandle) -> list[KafkaChangelogHandle]:
    handles = []
    for handle in keyed.changelog:
        if not isinstance(handle, KafkaChangelogHandle):
            raise UnreadableCheckpointError(
                f"checkpoint {checkpoint.checkpoint_id} of application "
                f"{checkpoint.application!r} holds a changelog handle of kind "
                f"{handle.kind!r} (operator {operator!r}, subtask {subtask}, log "
                f"{handle.log_id}); the Spark reader reads Kafka handles only")
        handles.append(handle)
    return handles


def key_types_of(checkpoint: CompletedCheckpoint) -> tuple[str, ...] | None:
    """The key column types the checkpoint records (None: not recorded)."""
    try:
        recorded = recorded_key_types(checkpoint.properties)
    except ValueError as exc:
        raise UnreadableCheckpointError(
            f"checkpoint {checkpoint.checkpoint_id} of application "
            f"{checkpoint.application!r}: {exc}") from exc
    return tuple(recorded) if recorded is not None else None


def plan_changes(checkpoint: CompletedCheckpoint, operators: Iterable[str],
                 slice_offsets: int) -> list[ChangesTask]:
    """One task per offset slice (at most ``slice_offsets``) of every changelog handle range."""
    key_types = key_types_of(checkpoint)
    tasks = []
    for operator in operators:
        for subtask in checkpoint.subtasks_of(operator):
            if subtask.keyed is None:
                continue
            for handle in _kafka_handles(checkpoint, operator, subtask.subtask_index,
                                         subtask.keyed):
                key_groups = handle.key_group_range
                for r in handle.ranges:
                    for start, end in split_offsets(r.start_offset, r.end_offset,
                                                    slice_offsets):
                        share = r.record_bytes * (end - start) // max(1, r.offset_count)
                        tasks.append(ChangesTask(operator, subtask.subtask_index, OffsetSlice(
                            handle.topic, r.partition, start, end, handle.log_id,
                            key_groups.start, key_groups.end, handle.from_sequence_number,
                            handle.to_sequence_number), key_types, share))
    return tasks


def plan_state(checkpoint: CompletedCheckpoint, operators: Iterable[str],
               slice_key_groups: int, timers: bool = False) -> list[StateTask]:
    """One task per key-group slice (at most ``slice_key_groups``) of every subtask (of
    its timers with ``timers``, else of its states' entries)."""
    key_types = key_types_of(checkpoint)
    at_ms = recorded_time(checkpoint.properties, PROCESSING_TIME_PROPERTY)
    tasks = []
    for operator in operators:
        for subtask in checkpoint.subtasks_of(operator):
            keyed = subtask.keyed
            if keyed is None or keyed.key_group_range.is_empty:
                continue
            _kafka_handles(checkpoint, operator, subtask.subtask_index, keyed)
            for key_groups in split_key_groups(keyed.key_group_range, slice_key_groups):
                narrowed = keyed.intersection(key_groups)
                if narrowed is not None:
                    tasks.append(StateTask(operator, subtask.subtask_index, key_groups,
                                           narrowed, key_types, at_ms, timers))
    return tasks


def referenced_topics(checkpoint: CompletedCheckpoint, operators: Iterable[str],
                      mode: str) -> dict[str, set[str]]:
    """The topics a read needs, by kind (``changelog``, ``snapshot``: modes ``state`` and
    ``timers`` only)."""
    topics = checkpoint.topics(operators)
    return {"changelog": set(topics.changelog),
            "snapshot": set(topics.snapshot) if mode != MODE_CHANGES else set()}


def check_topics(checkpoint: CompletedCheckpoint, operators: Iterable[str],
                 options: ReaderOptions, existing: set[str]) -> None:
    """The checkpoint's data must be in the topics the options name (when they name one),
    and those topics must exist."""
    expected = {"changelog": (options.changelog_topic, "changelog.topic"),
                "snapshot": (options.snapshot_topic, "snapshot.topic")}
    where = (f"checkpoint {checkpoint.checkpoint_id} of application "
             f"{checkpoint.application!r}")
    for kind, topics in referenced_topics(checkpoint, operators, options.mode).items():
        topic, option = expected[kind]
        others = sorted(topics - {topic}) if topic is not None else []
        if others:
            raise UnreadableCheckpointError(
                f"{where} keeps its {kind} in topic(s) {', '.join(others)}, not in {topic!r} "
                f"(option {option}); set {option} to the topic the job wrote to")
        missing = sorted(topics - existing)
        if missing:
            raise UnreadableCheckpointError(
                f"{kind} topic {missing[0]!r} of {where} does not exist on "
                f"{options.bootstrap_servers}: it was deleted, or the options point at "
                "another cluster")


def plan_read(options: ReaderOptions) -> ReadPlan:
    """Pick the checkpoint and plan the tasks of one read (driver side)."""
    topics = existing_topics(options)
    checkpoint = load_checkpoint(options, topics)
    operators = select_operators(checkpoint, options.operator)
    check_topics(checkpoint, operators, options, topics)
    tasks: list[ChangesTask | StateTask]
    if options.mode == MODE_CHANGES:
        tasks = list(plan_changes(checkpoint, operators, options.slice_offsets))
    else:
        tasks = list(plan_state(checkpoint, operators, options.slice_key_groups,
                                timers=options.mode == MODE_TIMERS))
    return ReadPlan(options.application, checkpoint.checkpoint_id, options.mode,
                    checkpoint.max_parallelism, tuple(operators), tuple(tasks))
