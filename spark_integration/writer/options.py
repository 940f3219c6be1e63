"""The options of a state write (``df.write.format("kafka-changelog")``), checked on the
driver.

The reader's connection options (``kafka.*``, ``application``, ``checkpoint.topic``,
``request.timeout.s`` ...) plus ``operator`` (the keyed operator written; default: the
application's only one), ``states``: the states' declarations as JSON
(:func:`declared_states`), for states the latest checkpoint records no registration of, or
to evolve one as a streaming query's ``states=[...]`` would, ``parallelism``: the
operator's in the new checkpoint (replacing writes; default: the latest's), and
``startingOffsets``: the input offsets the new checkpoint records (the Kafka source's
JSON; ``-1``/``-2``: the partition's latest/earliest offset now, on the state's brokers),
for the streaming query to continue from (default: the latest checkpoint's). An
application without a checkpoint gets its first from a write given its layout (a
bootstrap): ``operator`` and ``parallelism``, with ``maxParallelism`` (default 128),
``changelog.topic`` (default: the application's own) and ``partitions`` (of that topic when
created, default 16) as its ``StreamingStateConfig`` says. Options that
select what a read reads (``checkpoint``, ``mode``, slices, ``startingCheckpoint`` ...) are
refused: a state write applies to the latest checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kafka_changelog.state.schema.descriptors import StateDescriptor
from kafka_changelog.state.schema.evolution import requested_meta
from kafka_changelog.state.schema.ops import StateMeta

from ..reader.planning import FORMAT, ReaderOptionError, ReaderOptions, parse_options

#: Option: the declarations of the states written (JSON, see :func:`declared_states`).
STATES_OPTION = "states"
#: Option: the operator's parallelism in the new checkpoint (replacing writes only).
PARALLELISM_OPTION = "parallelism"
#: Option: the input offsets the new checkpoint records (``startingOffsets`` JSON).
STARTING_OFFSETS_OPTION = "startingOffsets"
#: Option: key groups of a new application (a bootstrap; must match an existing one's).
MAX_PARALLELISM_OPTION = "maxParallelism"
#: Option: partitions of a new application's changelog topic when the write creates it.
PARTITIONS_OPTION = "partitions"
#: A new application's defaults: ``StreamingStateConfig``'s.
DEFAULT_MAX_PARALLELISM = 128
DEFAULT_PARTITIONS = 16
#: Reader options that say what to read: meaningless for a write.
READ_ONLY_OPTIONS = ("checkpoint", "mode", "slice.offsets", "slice.keygroups",
                     "minpartitions", "startingcheckpoint", "endingcheckpoint", "pushdown",
                     "failondataloss")


@dataclass(frozen=True)
class WriterOptions:
    """The parsed options of one state write (picklable)."""

    connection: ReaderOptions
    #: The requested registrations of declared states (none: the recorded ones only).
    requested: tuple[StateMeta, ...] = ()
    #: The operator's parallelism in the new checkpoint (None: the latest's).
    parallelism: int | None = None
    #: The input offsets the new checkpoint records, as given (None: the latest's).
    starting_offsets: str | None = None
    #: Key groups (None: the latest checkpoint's; a new application's default 128).
    max_parallelism: int | None = None
    #: Partitions of a new application's changelog topic when created.
    partitions: int = DEFAULT_PARTITIONS

    @property
    def application(self) -> str:
        return self.connection.application


def declared_states(states: Sequence[StateDescriptor]) -> str:
    """The value of option ``states`` declaring ``states`` (the descriptors a streaming
    query declares): ``.option("states", declared_states([...]))``."""
    return json.dumps([requested_meta(d).to_record() for d in states], sort_keys=True)


def parse_writer_options(options: Mapping[str, str]) -> WriterOptions:
    """Check and parse the options; :class:`ReaderOptionError` names a bad one."""
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    refused = sorted(k for k in lowered if k in READ_ONLY_OPTIONS)
    if refused:
        raise ReaderOptionError(
            f"option(s) {', '.join(refused)} select what a read of format('{FORMAT}') reads; "
            "a write applies its rows to the application's latest checkpoint (drop them)")
    states_raw = lowered.pop(STATES_OPTION, "").strip()
    requested: tuple[StateMeta, ...] = ()
    if states_raw:
        try:
            records = json.loads(states_raw)
            requested = tuple(StateMeta.from_record(r) for r in records)
        except (ValueError, KeyError, TypeError) as exc:
            raise ReaderOptionError(
                f"option {STATES_OPTION} must be the JSON of declared_states([...]) (a list "
                f"of state registrations); {exc}: {states_raw[:200]!r}") from None
    parallelism = _positive(lowered, PARALLELISM_OPTION)
    max_parallelism = _positive(lowered, MAX_PARALLELISM_OPTION)
    partitions = _positive(lowered, PARTITIONS_OPTION)
    starting_offsets = lowered.pop(STARTING_OFFSETS_OPTION.lower(), "").strip() or None
    return WriterOptions(parse_options(lowered), requested, parallelism, starting_offsets,
                         max_parallelism,
                         DEFAULT_PARTITIONS if partitions is None else partitions)


def _positive(lowered: dict[str, str], name: str) -> int | None:
    """Option ``name`` (popped from ``lowered``) as a positive integer; None when absent."""
    raw = lowered.pop(name.lower(), "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ReaderOptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value < 1:
        raise ReaderOptionError(f"option {name} must be at least 1, got {value}")
    return value


__all__ = ["MAX_PARALLELISM_OPTION", "PARALLELISM_OPTION", "PARTITIONS_OPTION",
           "STARTING_OFFSETS_OPTION", "STATES_OPTION", "WriterOptions", "declared_states",
           "parse_writer_options"]
