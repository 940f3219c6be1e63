"""Command lines for the Kafka JVMs: the broker itself and the storage formatter."""

from __future__ import annotations

import base64
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from kafka_changelog.local_kafka.errors import ToolMissingError

# Measured on a 2-core box: the C1-only JIT and the serial collector bring a
# single node from "started" to "answers a produce" in ~3.0 s instead of ~3.8 s.
# Test brokers are short-lived and small, so peak throughput does not matter.
FAST_START_FLAGS: tuple[str, ...] = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",  # no hsperfdata files left in /tmp
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

SERVER_MAIN = "kafka.Kafka"
STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"


def find_java() -> str:
    """The ``java`` executable: ``$JAVA_HOME/bin/java`` if set, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    java = shutil.which("java")
    if java is None:
        raise ToolMissingError(
            "Java ('java') is not on PATH and JAVA_HOME does not point at a JDK; the local "
            "Kafka cluster needs Java 17 or newer to run the broker."
        )
    return java


def new_cluster_id() -> str:
    """A random Kafka cluster id, in the same form as ``kafka-storage.sh random-uuid``."""
    while True:
        raw = uuid.uuid4().bytes
        text = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
        # Kafka refuses ids that start with '-' (they look like a CLI flag).
        if not text.startswith("-"):
            return text


def _base(java: str, jars_dir: Path, log_config: Path, log_dir: Path, heap: str,
          jvm_options: Sequence[str]) -> list[str]:
    return [
        java,
        f"-Xmx{heap}",
        *FAST_START_FLAGS,
        *jvm_options,
        f"-Dlog4j2.configurationFile={log_config}",
        f"-Dkafka.logs.dir={log_dir}",
        "-cp",
        f"{jars_dir}/*",
    ]


def server_command(
    java: str,
    jars_dir: Path,
    properties: Path,
    *,
    log_config: Path,
    log_dir: Path,
    heap: str = "512m",
    jvm_options: Sequence[str] = (),
) -> list[str]:
    """``java ... kafka.Kafka server.properties`` for one combined broker+controller node."""
    return [*_base(java, jars_dir, log_config, log_dir, heap, jvm_options), SERVER_MAIN,
            str(properties)]


def format_command(
    java: str,
    jars_dir: Path,
    properties: Path,
    *,
    cluster_id: str,
    standalone: bool,
    scram_credentials: Sequence[str] = (),
    log_config: Path,
    log_dir: Path,
    jvm_options: Sequence[str] = (),
) -> list[str]:
    """``StorageTool format`` for one node.

    ``standalone`` formats a single-node dynamic quorum; a static quorum
    (``controller.quorum.voters``) is formatted without it on every node, with the
    same ``cluster_id``. ``scram_credentials`` are ``--add-scram`` arguments.
    """
    argv = [
        *_base(java, jars_dir, log_config, log_dir, "256m", jvm_options),
        STORAGE_TOOL_MAIN,
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(properties),
    ]
    if standalone:
        argv.append("--standalone")
    for credential in scram_credentials:
        argv += ["--add-scram", credential]
    return argv
