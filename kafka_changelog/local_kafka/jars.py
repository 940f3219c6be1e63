"""Find or download the Apache Kafka broker jars the local cluster runs.

The jars come from Maven Central through ``mvn dependency:copy-dependencies`` on
the ``pom.xml`` shipped next to this module, into a per-version cache outside
the work tree (``~/.cache/kafka-changelog/kafka-<version>/libs``, or the
directory named by ``KAFKA_CHANGELOG_JARS_DIR``); see
:mod:`kafka_changelog.local_kafka.maven` for how downloads stay safe.

Run ``python -m kafka_changelog.local_kafka.jars`` to fetch them ahead of time.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path

from kafka_changelog.local_kafka.errors import JarsUnavailableError, ToolMissingError
from kafka_changelog.local_kafka.maven import MARKER_NAME, cache_root, ensure_jars

KAFKA_VERSION = "4.1.1"
"""The Kafka release the local cluster runs (the default ``kafka.version`` of the pom)."""

TESTED_RELEASES = ("3.9.1", KAFKA_VERSION, "4.4.0")
"""The broker releases the library is tested against (README, "Supported versions")."""

JARS_DIR_ENV = "KAFKA_CHANGELOG_JARS_DIR"
"""Environment variable naming the jar directory, replacing the default cache."""

__all__ = ["JARS_DIR_ENV", "KAFKA_VERSION", "MARKER_NAME", "TESTED_RELEASES", "default_jars_dir",
           "ensure_kafka_jars", "is_complete"]


def default_jars_dir(version: str = KAFKA_VERSION) -> Path:
    """Where the jars of ``version`` live unless ``KAFKA_CHANGELOG_JARS_DIR`` says otherwise."""
    override = os.environ.get(JARS_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return cache_root() / f"kafka-{version}" / "libs"


def is_complete(jars_dir: Path) -> bool:
    """True if ``jars_dir`` holds a usable set of broker jars.

    Our own downloads carry a marker file; a directory filled by hand (e.g. the
    ``libs/`` of a Kafka distribution) is accepted if it has the broker jar.
    """
    if (jars_dir / MARKER_NAME).is_file():
        return True
    return jars_dir.is_dir() and any(jars_dir.glob("kafka_2.13-*.jar"))


def ensure_kafka_jars(version: str = KAFKA_VERSION) -> Path:
    """Return the directory holding the Kafka ``version`` broker jars, downloading them once.

    Raises:
        ToolMissingError: ``java`` or ``mvn`` is missing (and the jars are not cached).
        JarsUnavailableError: Maven failed, or the lock was held for too long.
    """

    def check(libs: Path) -> None:
        jars = sorted(p.name for p in libs.glob("*.jar"))
        if f"kafka_2.13-{version}.jar" not in jars:
            raise JarsUnavailableError(
                f"Maven succeeded but kafka_2.13-{version}.jar is not among the downloaded "
                f"jars ({len(jars)} files in {libs})"
            )

    return ensure_jars(
        default_jars_dir(version),
        resources.files(__package__).joinpath("pom.xml").read_text("utf-8"),
        {"kafka.version": version},
        what=f"Kafka {version}",
        check=check,
        is_complete=is_complete,
        mvn_hint=(
            "It is needed once to download the Kafka broker jars; install Maven, or point "
            f"{JARS_DIR_ENV} at a directory that already holds Kafka's jars (e.g. the libs/ "
            "folder of a Kafka distribution)."
        ),
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: download the jars of the release named (default: the local
    cluster's; ``--tested``: every tested release) if needed and print their directories."""
    args = sys.argv[1:] if argv is None else argv
    versions = TESTED_RELEASES if args == ["--tested"] else (args[0] if args else KAFKA_VERSION,)
    try:
        for version in versions:
            print(ensure_kafka_jars(version))
    except (JarsUnavailableError, ToolMissingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
