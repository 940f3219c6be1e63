"""Bounds on a host's local state directory: the stores nobody will reattach are deleted.

A subtask store (:mod:`~kafka_changelog.state.host.local_store`) is worth keeping while a task
may start from it, or catch up from it: a subtask that moved to another host left its
store here at an older checkpoint, and when it comes back a task replays only the
changelog since (see :mod:`~kafka_changelog.state.host.host_store`). So a host keeps at most
one store (and its copies) per subtask that ran on it; the subtask's own next task here
empties a store it cannot catch up from. What outlives that is removed by the tasks that
run on the host (no process of their own):

- **Idle** stores of any application under the same root: an application that stopped,
  or a subtask that never came back, leaves stores no task has locked for a long time
  (:func:`remove_idle`; the idea of Kafka Streams' ``state.cleanup.delay.ms``). A store's
  last use is the modification time of its directory, which each lock refreshes.
- Stores of another parallelism of the operator (the first task of the new one:
  :meth:`~kafka_changelog.state.host.local_store.SubtaskStore.remove_stale`).

Both delete only through :func:`~kafka_changelog.state.host.local_store.remove_store_directory`
(the store's lock taken, no background materialization job running), so a store in use is
never deleted; a busy one is left for a later sweep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from .local_store import (
    TRASH_PREFIX,
    remove_store_directory,
)

logger = logging.getLogger(__name__)

#: The default of how long a store may go unused before any task on the host deletes it.
DEFAULT_IDLE_STORE_RETENTION_S = 7 * 24 * 3600.0

_sweeps_lock = threading.Lock()
#: When each root was last swept for idle stores (monotonic seconds), per process.
_last_sweep: dict[Path, float] = {}


def remove_idle(root: Path, idle_s: float, now: float | None = None) -> list[Path]:
    """Delete every store under ``root`` (any application, any operator) that no task has
    locked for ``idle_s`` seconds and nobody holds, then the emptied directories."""
    removed: list[Path] = []
    cutoff = (time.time() if now is None else now) - idle_s
    for application in _directories(root):
        for operator in _directories(application):
            for path in _directories(operator):
                if path.name.startswith(TRASH_PREFIX):
                    shutil.rmtree(path, ignore_errors=True)
                    continue
                if _last_used(path) < cutoff and remove_store_directory(path):
                    removed.append(path)
            _remove_if_empty(operator)
        _remove_if_empty(application)
    if removed:
        logger.info("removed %d local state store(s) unused for more than %.0f s under %s",
                    len(removed), idle_s, root)
    return removed


def sweep_idle(root: Path, idle_s: float | None) -> list[Path]:
    """:func:`remove_idle`, at most once per ``min(idle_s / 10, 60 s)`` per root in this
    process (tasks call it on every attach; the sweep lists every store of the host).
    ``idle_s`` None: never."""
    if idle_s is None:
        return []
    now = time.monotonic()
    with _sweeps_lock:
        last = _last_sweep.get(root)
        if last is not None and now - last < min(idle_s / 10, 60.0):
            return []
        _last_sweep[root] = now
    return remove_idle(root, idle_s)


def _directories(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir())
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def _last_used(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return float("inf")  # gone already: nothing to delete


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (or gone): kept
        path.rmdir()


__all__ = ["DEFAULT_IDLE_STORE_RETENTION_S", "remove_idle", "sweep_idle"]
