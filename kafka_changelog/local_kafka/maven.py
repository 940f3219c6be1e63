"""Jars from Maven Central in a per-user cache, fetched once with ``mvn``.

Two sets of jars use this: the Kafka broker the local clusters run
(:mod:`kafka_changelog.local_kafka.jars`) and Spark's Kafka connector
(:mod:`spark_integration.sessions.connector`). Each set is resolved by
``mvn dependency:copy-dependencies -DincludeScope=runtime`` on a small pom into a
temporary directory that is renamed into place only when complete, under a file
lock, so concurrent or interrupted runs never see a half-filled cache.
(``dependency:get`` is not used: the old default dependency plugin also pulls
test-scope jars, and some of Spark's, such as the token provider's ``tests`` jar,
are not published.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from kafka_changelog.local_kafka.errors import JarsUnavailableError, ToolMissingError
from kafka_changelog.local_kafka.jvm import find_java
from kafka_changelog.local_kafka.process import die_with_parent

MARKER_NAME = ".complete"
"""File written last into a fully downloaded jar directory."""

LOCK_TIMEOUT_S = 900.0  # another process may be downloading ~50 MB over a slow link
MVN_TIMEOUT_S = 900.0


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/kafka-changelog`` (default ``~/.cache/kafka-changelog``)."""
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "kafka-changelog"


def find_mvn(hint: str) -> str:
    """The path of ``mvn``, or :class:`ToolMissingError` with ``hint`` on what else to do."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ToolMissingError(f"Maven ('mvn') is not on PATH. {hint}")
    return mvn


def has_marker(jars_dir: Path) -> bool:
    """True if ``jars_dir`` is a complete download of ours."""
    return (jars_dir / MARKER_NAME).is_file()


def ensure_jars(
    target: Path,
    pom_text: str,
    properties: Mapping[str, str],
    *,
    what: str,
    check: Callable[[Path], None],
    is_complete: Callable[[Path], bool] = has_marker,
    mvn_hint: str = "",
) -> Path:
    """Return ``target``, filling it once with the runtime jars of ``pom_text``.

    ``properties`` become ``-D`` arguments of Maven; ``check(libs)`` inspects (and may
    prune) the downloaded directory before it is marked complete and moved into place,
    raising :class:`JarsUnavailableError` if it is not usable; ``what`` names the jars
    in messages. Safe to call from several processes at once: one downloads, the
    others wait on a file lock and then reuse the result.
    """
    if is_complete(target):
        return target
    find_java()  # mvn needs it too; a missing JVM gets the clearer message
    mvn = find_mvn(mvn_hint)
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target.parent / f".{target.name}.lock"):
        if is_complete(target):  # someone else finished while we waited
            return target
        for stale in target.parent.glob(f".{target.name}-partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-partial-", dir=target.parent))
        try:
            libs = _download(mvn, pom_text, properties, staging, what)
            check(libs)
            jars = sorted(p.name for p in libs.glob("*.jar"))
            (libs / MARKER_NAME).write_text("\n".join([what, *jars]) + "\n", "utf-8")
            if target.exists():  # an unmarked, broken directory from before
                shutil.rmtree(target)
            os.rename(libs, target)  # atomic: readers see nothing or everything
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _download(mvn: str, pom_text: str, properties: Mapping[str, str], staging: Path,
              what: str) -> Path:
    """Run Maven into ``staging/libs``; return that directory."""
    pom = staging / "pom.xml"
    pom.write_text(pom_text, "utf-8")
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
        *(f"-D{key}={value}" for key, value in properties.items()),
    ]
    try:
        done = subprocess.run(
            argv,
            cwd=staging,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=MVN_TIMEOUT_S,
            check=False,
            preexec_fn=die_with_parent(),  # no orphan mvn writing into a half-deleted dir
        )
    except subprocess.TimeoutExpired as exc:
        raise JarsUnavailableError(
            f"Maven did not finish downloading the {what} jars within {MVN_TIMEOUT_S:.0f} s"
        ) from exc
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise JarsUnavailableError(
            f"Maven failed (exit code {done.returncode}) to download the {what} jars with: "
            f"{' '.join(argv)}\n{output}"
        )
    return libs


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path``; the kernel releases it if we die."""
    with open(path, "a+b") as handle:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise JarsUnavailableError(
                        f"Timed out after {LOCK_TIMEOUT_S:.0f} s waiting for another process "
                        f"to finish downloading jars (lock file {path})"
                    ) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
