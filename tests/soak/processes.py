"""Processes of the soak, found in ``/proc``: the driver's, the executors' and their Python
workers', with their resident memory and open file descriptors."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from tests.spark.standalone import LocalSparkCluster, descendants

PYTHON_DAEMON = "pyspark.daemon"
EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"


def command_line(pid: int) -> str:
    """The process's command line ('' once it exited)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def parent_of(pid: int) -> int | None:
    """The parent's pid (None once it exited)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def rss_kib(pid: int) -> int:
    """Resident memory (``VmRSS``) in KiB, 0 once the process exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def open_fds(pid: int) -> int:
    """Open file descriptors of the process, 0 once it exited."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _below_workers(cluster: LocalSparkCluster) -> list[int]:
    found = []
    for index in range(cluster.worker_count):
        pid = cluster.worker_pid(index)
        if pid is not None:
            found += descendants(pid)
    return sorted(found)


def executors(cluster: LocalSparkCluster) -> list[int]:
    """The executor JVMs of the cluster's workers, by pid."""
    return [pid for pid in _below_workers(cluster) if EXECUTOR_CLASS in command_line(pid)]


def python_workers(cluster: LocalSparkCluster) -> list[int]:
    """The executors' Python workers (the children PySpark's daemon forks), by pid."""
    below = _below_workers(cluster)
    daemons = {pid for pid in below if PYTHON_DAEMON in command_line(pid)}
    return [pid for pid in sorted(daemons) if parent_of(pid) in daemons]


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (found before the kill)."""
    below = descendants(pid)
    for victim in [pid, *below]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
