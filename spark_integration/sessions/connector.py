"""Spark's own Kafka connector (``format("kafka")``): its jars, resolved once.

PySpark does not ship the connector. Its jars must match the installed Spark
version exactly: ``org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>``.
:func:`ensure_connector_jars` resolves them from Maven Central with
``mvn dependency:copy-dependencies`` (runtime scope) into the cache that also holds
the Kafka broker jars (``~/.cache/kafka-changelog/spark-kafka-<version>/jars``, or
``KAFKA_CHANGELOG_SPARK_JARS_DIR``), keeping only the jars PySpark does not bring
itself: for Spark 4.2.0 the connector, ``spark-token-provider-kafka-0-10``,
``kafka-clients`` and ``commons-pool2``. The session helpers
(:mod:`spark_integration.sessions.session`) add them to ``spark.jars``; sessions built
otherwise can use ``spark.jars.packages`` with :func:`connector_coordinates`.

``./scripts/setup.sh`` runs ``python -m spark_integration.sessions.connector`` once.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from kafka_changelog.local_kafka.errors import JarsUnavailableError, ToolMissingError
from kafka_changelog.local_kafka.maven import cache_root, ensure_jars, has_marker

JARS_DIR_ENV = "KAFKA_CHANGELOG_SPARK_JARS_DIR"
"""Environment variable naming the connector's jar directory, replacing the default cache."""

SCALA_VERSION = "2.13"  # Spark 4 is built for Scala 2.13 only
CONNECTOR_GROUP = "org.apache.spark"
CONNECTOR_ARTIFACT = f"spark-sql-kafka-0-10_{SCALA_VERSION}"

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Spark's Kafka connector and its runtime dependencies (nothing is built from this). -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.github.kafka-changelog</groupId>
  <artifactId>kafka-changelog-spark-kafka-connector</artifactId>
  <version>0.1.0</version>
  <packaging>pom</packaging>
  <properties>
    <spark.version>4.2.0</spark.version>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencies>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_2.13</artifactId>
      <version>${spark.version}</version>
    </dependency>
  </dependencies>
</project>
"""

#: ``-<version>.jar`` at the end of a Maven jar's file name (``kafka-clients-3.9.2.jar``).
_VERSION_SUFFIX = re.compile(r"-\d+(?:\.\d+)+(?:[.-][A-Za-z0-9]+)*\.jar$")


def spark_version() -> str:
    """The installed PySpark's version."""
    import pyspark

    return str(pyspark.__version__)


def connector_coordinates(version: str | None = None) -> str:
    """``group:artifact:version`` of the connector for Spark ``version`` (default: installed),
    e.g. for ``spark.jars.packages``."""
    return f"{CONNECTOR_GROUP}:{CONNECTOR_ARTIFACT}:{version or spark_version()}"


def default_jars_dir(version: str | None = None) -> Path:
    """Where the connector jars of Spark ``version`` live (see the module docstring)."""
    override = os.environ.get(JARS_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return cache_root() / f"spark-kafka-{version or spark_version()}" / "jars"


def artifact_of(jar_name: str) -> str:
    """The artifact id of a Maven jar file name (``commons-pool2-2.13.1.jar`` ->
    ``commons-pool2``)."""
    found = _VERSION_SUFFIX.search(jar_name)
    return jar_name[: found.start()] if found else jar_name.removesuffix(".jar")


def pyspark_jars_dir() -> Path:
    """The ``jars`` directory of the installed PySpark (its JVM classpath)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def is_complete(jars_dir: Path) -> bool:
    """True if ``jars_dir`` is a download of ours, or a directory filled by hand that holds
    the connector jar."""
    return has_marker(jars_dir) or (
        jars_dir.is_dir() and any(jars_dir.glob(f"{CONNECTOR_ARTIFACT}-*.jar")))


def ensure_connector_jars(version: str | None = None) -> list[Path]:
    """The connector's jars for Spark ``version`` (default: installed), resolved once.

    Raises:
        ToolMissingError: ``java`` or ``mvn`` is missing (and the jars are not cached).
        JarsUnavailableError: Maven could not resolve them (e.g. a Spark version whose
            connector is not on Maven Central), or the lock was held for too long.
    """
    version = version or spark_version()
    coordinates = connector_coordinates(version)
    target = default_jars_dir(version)

    def check(libs: Path) -> None:
        # Jars PySpark has already (Scala, Hadoop client, slf4j, ...) would be second,
        # possibly other, versions on the classpath: keep only the connector's own.
        present = {artifact_of(p.name) for p in pyspark_jars_dir().glob("*.jar")}
        for jar in libs.glob("*.jar"):
            if artifact_of(jar.name) in present:
                jar.unlink()
        kept = {artifact_of(p.name) for p in libs.glob("*.jar")}
        if CONNECTOR_ARTIFACT not in kept:
            raise JarsUnavailableError(
                f"Maven succeeded but {coordinates} is not among the resolved jars "
                f"({sorted(kept)} in {libs})")

    try:
        jars_dir = ensure_jars(
            target, _POM, {"spark.version": version}, what=f"Spark Kafka connector {version}",
            check=check, is_complete=is_complete,
            mvn_hint=(f"It is needed once to resolve Spark's Kafka connector ({coordinates}); "
                      f"install Maven, point {JARS_DIR_ENV} at a directory holding the "
                      "connector's jars, or let Spark fetch them with "
                      f"spark.jars.packages={coordinates}."))
    except JarsUnavailableError as exc:
        raise JarsUnavailableError(
            f"{exc}\nSpark's Kafka connector must match the installed PySpark ({version}); "
            "it is on Maven Central for 4.2.0, 4.1.1 and 4.0.0 but not for every release "
            "(e.g. 4.2.1, 4.3.0): install a tested one (pip install 'pyspark==4.2.0', "
            "'pyspark==4.1.1' or 'pyspark==4.0.0').") from exc
    return sorted(jars_dir.glob("*.jar"))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: resolve the connector jars if needed and print them."""
    args = sys.argv[1:] if argv is None else argv
    try:
        for jar in ensure_connector_jars(args[0] if args else None):
            print(jar)
    except (JarsUnavailableError, ToolMissingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
