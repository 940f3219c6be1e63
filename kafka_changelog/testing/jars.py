"""Find or download the Apache Kafka broker jars the local test cluster runs.

The jars come from Maven Central through ``mvn dependency:copy-dependencies`` on
the ``pom.xml`` shipped next to this module, into a per-version cache outside
the work tree (``~/.cache/kafka-changelog/kafka-<version>/libs``, or the
directory named by ``KAFKA_CHANGELOG_JARS_DIR``). The download lands in a
temporary directory that is renamed into place only when complete, under a file
lock, so concurrent or interrupted runs never see a half-filled cache.

Run ``python -m kafka_changelog.testing.jars`` to fetch them ahead of time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from kafka_changelog.testing.errors import JarsUnavailableError, ToolMissingError
from kafka_changelog.testing.jvm import find_java
from kafka_changelog.testing.process import die_with_parent

KAFKA_VERSION = "4.1.1"
"""The Kafka release the harness runs (the default ``kafka.version`` of the pom)."""

JARS_DIR_ENV = "KAFKA_CHANGELOG_JARS_DIR"
"""Environment variable naming the jar directory, replacing the default cache."""

MARKER_NAME = ".complete"
"""File written last into a fully downloaded jar directory."""

_LOCK_TIMEOUT_S = 900.0  # another process may be downloading ~50 MB over a slow link
_MVN_TIMEOUT_S = 900.0


def default_jars_dir(version: str = KAFKA_VERSION) -> Path:
    """Where the jars of ``version`` live unless ``KAFKA_CHANGELOG_JARS_DIR`` says otherwise."""
    override = os.environ.get(JARS_DIR_ENV)
    if override:
        return Path(override).expanduser()
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "kafka-changelog" / f"kafka-{version}" / "libs"


def is_complete(jars_dir: Path) -> bool:
    """True if ``jars_dir`` holds a usable set of broker jars.

    Our own downloads carry a marker file; a directory filled by hand (e.g. the
    ``libs/`` of a Kafka distribution) is accepted if it has the broker jar.
    """
    if (jars_dir / MARKER_NAME).is_file():
        return True
    return jars_dir.is_dir() and any(jars_dir.glob("kafka_2.13-*.jar"))


def find_mvn() -> str:
    """The path of ``mvn``, or :class:`ToolMissingError` saying how to get it."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ToolMissingError(
            "Maven ('mvn') is not on PATH. It is needed once to download the Kafka broker "
            f"jars; install Maven, or point {JARS_DIR_ENV} at a directory that already "
            "holds Kafka's jars (e.g. the libs/ folder of a Kafka distribution)."
        )
    return mvn


def ensure_kafka_jars(version: str = KAFKA_VERSION) -> Path:
    """Return the directory holding the Kafka ``version`` broker jars, downloading them once.

    Safe to call from several processes at once: one downloads, the others wait
    on a file lock and then reuse the result.

    Raises:
        ToolMissingError: ``java`` or ``mvn`` is missing (and the jars are not cached).
        JarsUnavailableError: Maven failed, or the lock was held for too long.
    """
    target = default_jars_dir(version)
    if is_complete(target):
        return target
    find_java()  # mvn needs it too; a missing JVM gets the clearer message
    mvn = find_mvn()
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.parent / f".{target.name}.lock"):
        if is_complete(target):  # someone else finished while we waited
            return target
        _remove_leftovers(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-partial-", dir=target.parent))
        try:
            libs = _download(mvn, version, staging)
            if target.exists():  # an unmarked, broken directory from before
                shutil.rmtree(target)
            os.rename(libs, target)  # atomic: readers see nothing or everything
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _download(mvn: str, version: str, staging: Path) -> Path:
    """Run Maven into ``staging/libs``, check the result, write the marker; return the dir."""
    pom = staging / "pom.xml"
    pom.write_text(_package_file("pom.xml"), "utf-8")
    libs = staging / "libs"
    argv = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={libs}",
        "-DincludeScope=runtime",
        f"-Dkafka.version={version}",
    ]
    try:
        done = subprocess.run(
            argv,
            cwd=staging,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_MVN_TIMEOUT_S,
            check=False,
            preexec_fn=die_with_parent(),  # no orphan mvn writing into a half-deleted dir
        )
    except subprocess.TimeoutExpired as exc:
        raise JarsUnavailableError(
            f"Maven did not finish downloading the Kafka {version} jars within "
            f"{_MVN_TIMEOUT_S:.0f} s"
        ) from exc
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise JarsUnavailableError(
            f"Maven failed (exit code {done.returncode}) to download the Kafka {version} "
            f"jars with: {' '.join(argv)}\n{output}"
        )
    jars = sorted(p.name for p in libs.glob("*.jar"))
    if f"kafka_2.13-{version}.jar" not in jars:
        raise JarsUnavailableError(
            f"Maven succeeded but kafka_2.13-{version}.jar is not among the downloaded jars "
            f"({len(jars)} files in {libs})"
        )
    (libs / MARKER_NAME).write_text("\n".join([f"kafka {version}", *jars]) + "\n", "utf-8")
    return libs


def _package_file(name: str) -> str:
    """Text of a data file shipped in this package (works from a wheel as well)."""
    return resources.files("kafka_changelog.testing").joinpath(name).read_text("utf-8")


def _remove_leftovers(target: Path) -> None:
    """Delete staging dirs of interrupted downloads (only called while holding the lock)."""
    for stale in target.parent.glob(f".{target.name}-partial-*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path``; the kernel releases it if we die."""
    with open(path, "a+b") as handle:
        deadline = time.monotonic() + _LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise JarsUnavailableError(
                        f"Timed out after {_LOCK_TIMEOUT_S:.0f} s waiting for another process "
                        f"to finish downloading the Kafka jars (lock file {path})"
                    ) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: download the jars if needed and print their directory."""
    args = sys.argv[1:] if argv is None else argv
    version = args[0] if args else KAFKA_VERSION
    try:
        print(ensure_kafka_jars(version))
    except (JarsUnavailableError, ToolMissingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
