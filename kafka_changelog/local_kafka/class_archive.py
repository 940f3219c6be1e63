"""A class-data-sharing archive of a Kafka release's classes, for faster local nodes.

A node's JVM parses and verifies a few thousand classes before it answers; mapped from an
archive made once, a node (and its storage formatter) starts with about 1.5 CPU-s less
(measured on two cores: 5.8 -> 4.3 CPU-s for a one-node start, 4.5 -> 3.3 s). The archive
is made by one exercised node run with ``-XX:ArchiveClassesAtExit`` and stopped
gracefully (a JVM writes it on a normal exit), then renamed into place next to the
release's jars, named by the Java that made it: a JVM never maps half an archive nor one
of another Java. A JVM that cannot use it (another class path, a Java updated in place)
runs without it, silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

#: Unified-logging tags a JVM would print on (to its standard output) when the archive
#: does not fit it.
QUIET_OPTIONS = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def jar_fingerprints(jars_dir: Path) -> list[str]:
    """Name, size and time of each jar: a JVM checks the last two against the archive's
    record, so jars fetched again (or a new virtualenv at the same path) need a new one."""
    return sorted(f"{p.name} {p.stat().st_size} {p.stat().st_mtime_ns}"
                  for p in jars_dir.glob("*.jar"))


def keep_newest(directory: Path, pattern: str, kept: int) -> None:
    """Delete all but the ``kept`` newest archives matching ``pattern`` (and their locks)."""
    archives = sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in archives[kept:]:
        stale.unlink(missing_ok=True)
        stale.with_suffix(".lock").unlink(missing_ok=True)


def archive_path(java: str, jars_dir: Path, flags: Sequence[str]) -> Path:
    """Where the archive of ``jars_dir``'s classes for this ``java`` and JVM ``flags`` is."""
    real = os.path.realpath(java)
    stat = os.stat(real)
    key = "\n".join([real, str(stat.st_mtime_ns), str(stat.st_size), *flags,
                     *jar_fingerprints(jars_dir)])
    return jars_dir.parent / f"classes-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def use_options(archive: Path) -> list[str]:
    """The JVM options mapping ``archive``."""
    return [f"-XX:SharedArchiveFile={archive}", *QUIET_OPTIONS]


def base_archive(java: str) -> Path:
    """The Java's own archive of its classes, which the archive made here extends."""
    return Path(os.path.realpath(java)).parent.parent / "lib" / "server" / "classes.jsa"


def dump_options(partial: Path, java: str) -> list[str]:
    """The JVM options of the node whose exit writes the archive to ``partial``: named
    on top of the Java's own archive (an archive named in ``JAVA_TOOL_OPTIONS``, as the
    tests name Spark's, would otherwise be taken for the base, and the node would not
    start)."""
    return [f"-XX:SharedArchiveFile={base_archive(java)}",
            f"-XX:ArchiveClassesAtExit={partial}", *QUIET_OPTIONS]


@contextlib.contextmanager
def _only_one_maker(lock: Path) -> Iterator[bool]:
    """True for the one process (of those on this machine) that may make the archive now;
    the others start their nodes without it rather than wait."""
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_archive(archive: Path, java: str,
                   run_exercised_node: Callable[[list[str]], None]) -> bool:
    """Make ``archive`` if it is missing; True if it exists afterwards.

    ``run_exercised_node(jvm_options)`` starts one node with those options, serves some
    clients' requests and stops it gracefully. Any failure only leaves the archive out.
    """
    if archive.exists():
        return True
    if not base_archive(java).exists():  # a Java without its own archive extends none
        return False
    with _only_one_maker(archive.with_suffix(".lock")) as maker:
        if not maker or archive.exists():
            return archive.exists()
        logger.info("making %s: a one-time class archive for faster local Kafka nodes "
                    "(about 15 s)", archive)
        workdir = Path(tempfile.mkdtemp(prefix="classes-", dir=archive.parent))
        partial = workdir / archive.name
        try:
            run_exercised_node(dump_options(partial, java))
            if partial.exists() and partial.stat().st_size > 0:
                os.replace(partial, archive)
                # Another Java or jars fetched again made the others (~50 MB each).
                keep_newest(archive.parent, "classes-*.jsa", 2)
        except Exception as exc:  # the nodes start without it: slower, not wrong
            logger.info("no class archive for the local Kafka nodes: %s", exc)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return archive.exists()


def exercise(bootstrap_servers: str) -> None:
    """Requests every local cluster serves (topics, idempotent and transactional produce,
    a consumer group's fetch and commit), so that their classes are in the archive."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    client: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap_servers,
                                                  "log_level": 0}
    admin = AdminClient(client)
    topic = "class-archive"
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[
        topic].result(30)
    producer = Producer({**client, "transactional.id": "class-archive", "acks": "all"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"v")
    producer.commit_transaction(30)
    consumer = Consumer({**client, "group.id": "class-archive", "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                consumer.commit(message=message, asynchronous=False)
                break
    finally:
        consumer.close()
