"""The options of a state write (``df.write.format("kafka-changelog")``), checked on the
driver.

The reader's connection options (``kafka.*``, ``application``, ``checkpoint.topic``,
``request.timeout.s`` ...) plus ``operator`` (the keyed operator written; default: the
application's only one), ``states``: the states' declarations as JSON
(:func:`declared_states`), for states the latest checkpoint records no registration of, or
to evolve one as a streaming query's ``states=[...]`` would, and ``parallelism``: the
operator's in the new checkpoint (replacing writes; default: the latest's). Options that
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
    parallelism_raw = lowered.pop(PARALLELISM_OPTION, "").strip()
    parallelism: int | None = None
    if parallelism_raw:
        try:
            parallelism = int(parallelism_raw)
        except ValueError:
            raise ReaderOptionError(f"option {PARALLELISM_OPTION} must be an integer, got "
                                    f"{parallelism_raw!r}") from None
    return WriterOptions(parse_options(lowered), requested, parallelism)


__all__ = ["PARALLELISM_OPTION", "STATES_OPTION", "WriterOptions", "declared_states",
           "parse_writer_options"]
