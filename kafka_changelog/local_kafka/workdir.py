"""Per-cluster temporary directories, and removal of those left by killed runs."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

ROOT_PREFIX = "kafka-changelog-cluster-"
_OWNER_FILE = "owner"


def _start_time(pid: int) -> str | None:
    """Kernel start time of ``pid`` (tells a live owner from a recycled pid); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may contain spaces, so split after its ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def make_cluster_root() -> Path:
    """A fresh temp dir for one cluster, tagged with our pid so a later run can reclaim it."""
    sweep_stale_roots()
    root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX))
    pid = os.getpid()
    (root / _OWNER_FILE).write_text(f"{pid} {_start_time(pid) or '-'}\n")
    return root


def release_cluster_root(root: Path) -> None:
    """Disown ``root``: :func:`sweep_stale_roots` will leave it alone (kept for debugging)."""
    with contextlib.suppress(OSError):
        (root / _OWNER_FILE).unlink()


def sweep_stale_roots() -> None:
    """Delete cluster dirs whose owning process is dead (it was killed with SIGKILL)."""
    if not Path("/proc/self/stat").exists():
        return  # cannot tell dead owners from live ones without procfs
    for root in Path(tempfile.gettempdir()).glob(f"{ROOT_PREFIX}*"):
        try:
            pid_text, started = (root / _OWNER_FILE).read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            continue  # not ours, or still being set up
        if _start_time(pid) != started:
            with contextlib.suppress(OSError):
                shutil.rmtree(root)
