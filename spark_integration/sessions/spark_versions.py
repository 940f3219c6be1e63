"""The PySpark releases the library runs on, and what each of them can do.

Supported: PySpark 4.0, 4.1 and 4.2, the minor releases whose Kafka connector
(``spark-sql-kafka-0-10_2.13``, exactly the installed version) resolves from Maven
Central: 4.0.0, 4.1.1 and 4.2.0 (a later patch release of the same minor runs the same
way where its connector is published). Spark 3.x is refused (Scala 2.12, no Python data
source API for streaming), and so is a minor newer than the newest tested one: the
library talks to PySpark's worker protocols (data sources, the worker daemon), which
change between minors without notice.

Some features need a newer Spark than the oldest supported one (:class:`SparkFeature`).
Where one is missing the library says so and does the same work another way
(:func:`supports`, :func:`missing`): results never depend on the version, only how much
is read or how a run ends.

Imports no pyspark at module level: ``spark_release`` reads the installed version from
the package metadata when no version is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import TYPE_CHECKING, Any

from kafka_changelog.errors import ChangelogError

if TYPE_CHECKING:
    import pyarrow as pa

#: The supported minor releases, oldest first.
SUPPORTED_MINORS: tuple[tuple[int, int], ...] = ((4, 0), (4, 1), (4, 2))
#: The releases the compatibility run tests (``scripts/compat.sh``).
TESTED_RELEASES: tuple[str, ...] = ("4.0.0", "4.1.1", "4.2.0")

_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


class UnsupportedSparkVersionError(ChangelogError):
    """The installed PySpark is not one the library runs on (see the message)."""


@dataclass(frozen=True)
class _FeatureInfo:
    what: str
    since: tuple[int, int]
    without: str


class SparkFeature(Enum):
    """A PySpark feature newer than the oldest supported release, with what the library
    does without it."""

    #: ``DataSourceReader.pushFilters``: ``format("kafka-changelog")`` option
    #: ``pushdown`` reads only the key groups a filter on keys selects.
    READER_FILTER_PUSHDOWN = _FeatureInfo(
        "filter pushdown of Python data sources (option pushdown)", (4, 1),
        "every key group is read and Spark applies the filters to the rows (same rows, "
        "more read)")
    #: ``spark.sql.unionOutputPartitioning``: a union keeps its children's hash
    #: partitioning, which keeps each subtask's task on the host of its store.
    SUBTASK_PLACEMENT = _FeatureInfo(
        "keeping each subtask on the host of its store (a union that keeps its children's "
        "partitioning)", (4, 1),
        "Spark runs each subtask's task on any executor: on a cluster a subtask that moves "
        "restores its store from Kafka on its new host (same state, more read)")
    #: ``SupportsTriggerAvailableNow`` and admission control of Python streaming sources:
    #: the change feed fixes the end of a ``Trigger.AvailableNow`` run itself.
    STREAM_AVAILABLE_NOW = _FeatureInfo(
        "Trigger.AvailableNow in Python streaming sources (the change feed)", (4, 2),
        "Spark's AvailableNow wrapper (spark.sql.streaming.triggerAvailableNowWrapper."
        "enabled, which register() turns on) fixes the run's end at the latest checkpoint "
        "when the run starts (same checkpoints emitted)")

    @property
    def since(self) -> tuple[int, int]:
        """The first minor release that has the feature."""
        return self.value.since


def spark_release(version: str | None = None) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of ``version`` (default: the installed PySpark)."""
    text = version if version is not None else installed_version()
    found = _RELEASE.match(text)
    if found is None:
        raise UnsupportedSparkVersionError(f"cannot read the PySpark version {text!r}")
    return int(found[1]), int(found[2]), int(found[3] or 0)


@cache
def installed_version() -> str:
    """The installed PySpark's version: its package metadata (no import of pyspark), or
    ``pyspark.__version__`` where PySpark comes from a Spark distribution's ``python``
    directory on the path (``spark-submit``, managed platforms), which has no metadata."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("pyspark", "pyspark-client"):  # pyspark-client: Spark Connect's client
        try:
            return version(name)
        except PackageNotFoundError:
            pass
    try:
        import pyspark
    except ImportError:
        raise UnsupportedSparkVersionError(
            "PySpark is not installed: pip install 'kafka-changelog[spark]' (PySpark "
            f"{_supported_text()})") from None
    return str(pyspark.__version__)


def _supported_text() -> str:
    return ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED_MINORS)


def require_supported_spark(version: str | None = None) -> tuple[int, int, int]:
    """The release of ``version`` (default: installed) if the library supports it.

    Raises:
        UnsupportedSparkVersionError: naming the version, the supported ones and why.
    """
    release = spark_release(version)
    shown = version if version is not None else installed_version()
    if release[:2] in SUPPORTED_MINORS:
        return release
    oldest, newest = SUPPORTED_MINORS[0], SUPPORTED_MINORS[-1]
    if release[:2] < oldest:
        why = ("older than 4.0: Spark 3 runs Scala 2.12 and has no Python data source API "
               "(the reader, the change feed)")
    else:
        why = (f"newer than {newest[0]}.{newest[1]}, the newest release tested: the library "
               "talks to PySpark's worker and data source protocols, which change between "
               "minor releases, and Spark's Kafka connector must exist for exactly that "
               "version")
    raise UnsupportedSparkVersionError(
        f"PySpark {shown} is not supported ({why}); supported: PySpark {_supported_text()} "
        f"(tested: {', '.join(TESTED_RELEASES)}). Install one with "
        "pip install 'pyspark>=4.0.0,<4.3' (docs/spark.md, Spark versions)")


def supports(feature: SparkFeature, version: str | None = None) -> bool:
    """Whether ``version`` (default: installed) has ``feature``."""
    return spark_release(version)[:2] >= feature.since


def missing(feature: SparkFeature, version: str | None = None) -> str:
    """What a user is told when ``version`` (default: installed) lacks ``feature``."""
    shown = version if version is not None else installed_version()
    info = feature.value
    return (f"{info.what} needs PySpark {info.since[0]}.{info.since[1]} or later (installed: "
            f"{shown}): {info.without}")


def arrow_schema_of(struct: Any) -> pa.Schema:
    """The Arrow schema Spark gives a ``StructType``'s rows, timestamps in UTC, on every
    supported release (4.2 takes the time zone as ``timezone`` and requires it for
    timestamps; 4.0 and 4.1 take ``timestamp_utc``)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if spark_release()[:2] >= (4, 2):
        return to_arrow_schema(struct, timezone="UTC")
    return to_arrow_schema(struct, timestamp_utc=True)  # type: ignore[call-arg]


__all__ = [
    "SUPPORTED_MINORS",
    "TESTED_RELEASES",
    "SparkFeature",
    "UnsupportedSparkVersionError",
    "arrow_schema_of",
    "installed_version",
    "missing",
    "require_supported_spark",
    "spark_release",
    "supports",
]
