"""Start, signal and always clean up the JVM processes of the local clusters.

Every process runs in its own process group (so signals reach any children it
forks) and is tracked in a module-level registry. The registry is emptied (all
processes killed, all registered directories removed) by an ``atexit`` hook and
by a SIGTERM handler. On Linux each child also gets a parent-death signal, so
even a ``kill -9`` of the Python process does not leave brokers running.

``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits, not
the process. So children are forked by the main thread, or, when called from
another thread, by a spawner thread that lives until interpreter exit: a
cluster (re)started from a short-lived worker thread does not die with it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType

_PR_SET_PDEATHSIG = 1

_lock = threading.RLock()
_processes: dict[int, subprocess.Popen[bytes]] = {}
_directories: list[Path] = []
_hooks_installed = False
_spawner_pool: ThreadPoolExecutor | None = None
_previous_sigterm: signal.Handlers | Callable[[int, FrameType | None], object] | int | None = None


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (looked up once, in the parent, so the forked child only calls it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    prctl: Callable[..., int] = libc.prctl
    return prctl


_prctl = _load_prctl()


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` making the child get SIGKILL when this process (thread) dies."""
    return _child_setup(os.getpid())


def _child_setup(parent_pid: int) -> Callable[[], None]:
    """``preexec_fn``: die with the parent. Runs in the child between fork and exec."""

    def setup() -> None:
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died before prctl took effect: then nobody would kill us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return setup


def spawn(
    argv: Sequence[str],
    *,
    output: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group with stdout+stderr appended to ``output``.

    The process is registered for cleanup at interpreter exit / SIGTERM.
    """
    _install_hooks()
    if threading.current_thread() is threading.main_thread():
        return _spawn_here(argv, output, cwd, env)
    return _spawner().submit(_spawn_here, argv, output, cwd, env).result()


def _spawner() -> ThreadPoolExecutor:
    """The long-lived thread that forks children for callers that are not the main thread."""
    global _spawner_pool
    with _lock:
        if _spawner_pool is None:
            _spawner_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-spawner")
        return _spawner_pool


def _spawn_here(
    argv: Sequence[str], output: Path, cwd: Path | None, env: Mapping[str, str] | None
) -> subprocess.Popen[bytes]:
    with open(output, "ab") as sink, _lock:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own session and process group
            preexec_fn=die_with_parent(),
        )
        _processes[proc.pid] = proc
    return proc


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> bool:
    """Send ``sig`` to the process group of ``proc``; False if it is already gone."""
    if proc.returncode is not None:
        return False
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    return True


def terminate(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM the group, wait up to ``timeout`` s, then SIGKILL; return the exit code."""
    if signal_group(proc, signal.SIGTERM):
        signal_group(proc, signal.SIGCONT)  # a paused (SIGSTOPped) JVM cannot handle SIGTERM
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        code = kill(proc)
    _forget(proc)
    return code


def kill(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGKILL the group and reap the process; return its exit code."""
    signal_group(proc, signal.SIGKILL)
    code = proc.wait(timeout)
    _forget(proc)
    return code


def track_directory(path: Path) -> None:
    """Remove ``path`` in :func:`cleanup_all` unless :func:`untrack_directory` is called first."""
    with _lock:
        _directories.append(path)


def untrack_directory(path: Path) -> None:
    """Stop tracking ``path`` (the owner removed it)."""
    with _lock, contextlib.suppress(ValueError):
        _directories.remove(path)


def tracked_pids() -> list[int]:
    """Pids of the processes still registered (for diagnostics and tests)."""
    with _lock:
        return list(_processes)


def cleanup_all() -> None:
    """Kill every registered process group and delete every registered directory."""
    with _lock:
        processes = list(_processes.values())
        directories = list(_directories)
        _processes.clear()
        _directories.clear()
    for proc in processes:
        signal_group(proc, signal.SIGKILL)
    for proc in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    for path in directories:
        shutil.rmtree(path, ignore_errors=True)


def _forget(proc: subprocess.Popen[bytes]) -> None:
    with _lock:
        _processes.pop(proc.pid, None)


def _install_hooks() -> None:
    """Register the atexit hook and (from the main thread only) the SIGTERM handler."""
    global _hooks_installed, _previous_sigterm
    with _lock:
        if _hooks_installed:
            return
        _hooks_installed = True
        atexit.register(cleanup_all)
        if threading.current_thread() is threading.main_thread():
            _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    cleanup_all()
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # default action: die of SIGTERM, as we would have without this handler
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
