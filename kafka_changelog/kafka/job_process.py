"""Writing a store materialization job in a process of its own, at a lower CPU priority.

A job (:mod:`kafka_changelog.state.host.store_materialization`) written on a thread of the
Python worker that made it shares that worker's GIL with the next tasks: while it
encodes and sends its key groups, the task's own thread gets about half of the
interpreter, and a batch that overlaps a materialization takes visibly longer than the
others. Lowering a thread's priority does not help (a low-priority thread holding the
GIL stalls the task). A separate process has no GIL to share, and its ``nice`` value
lets the operating system give the cores to the tasks first.

The process is ``python -m kafka_changelog.kafka.job_process``: it gets what it needs
(the job directory, the snapshot store's settings, its priority and deadline) pickled
on its standard input, not on its command line or on disk (the client settings may hold
credentials). It inherits the job's lock descriptor, so the job stays *running* for
every other process exactly as long as it writes (the parent closes its copy once the
child has started); when it ends, however it ends, the lock goes with it. It stays in
the parent's process group: a Spark executor that stops takes it along (its job then
counts as failed and its key groups are written by a later one), while a single Python
worker that Spark retires does not.

``SIGTERM`` stops the job before its next key group: the chunks it wrote are tombstoned
and the process exits 1 (how a closing worker stops it, :mod:`spark_integration`'s
``WorkerResources.release``); ``SIGKILL`` or the deadline end it at once.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ..state.host.store_materialization import MaterializationJob, StartedJob, run_job
from .snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobRequest:
    """What a job process is told on its standard input."""

    path: str
    lock_fd: int
    snapshots: SnapshotStoreConfig
    #: Added to the process's ``nice`` value (0: the tasks' priority).
    nice: int
    #: The process ends after this many seconds whatever it is doing (its job fails).
    deadline_s: float


def spawn_job(started: StartedJob, snapshots: SnapshotStoreConfig, nice: int = 10,
              deadline_s: float = 600.0) -> subprocess.Popen[bytes]:
    """Start a process writing ``started``'s job to the snapshot store of ``snapshots``.

    On success the process holds the job's lock and ``started.lock_fd`` is closed here;
    on failure (``OSError``) nothing was started and the caller still holds the lock
    (it may write the job itself). Reap the returned process (``poll``/``wait``).
    """
    try:
        request = pickle.dumps(JobRequest(str(started.path), started.lock_fd, snapshots,
                                          nice, deadline_s))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        # e.g. a client setting that is a callback defined in a function (oauth_cb)
        raise OSError(f"the snapshot store settings cannot be handed to a process: "
                      f"{exc}") from exc
    # The child imports this package the way this process did (Spark adds py-files and
    # archives to sys.path at run time, not to the environment).
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    process = subprocess.Popen(
        [sys.executable, "-m", __name__], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, pass_fds=(started.lock_fd,), env=environment)
    try:
        assert process.stdin is not None
        process.stdin.write(request)
        process.stdin.close()
    except BaseException:
        process.kill()
        process.wait()
        raise OSError(f"materialization process for {started.path} did not start") from None
    os.close(started.lock_fd)  # the child's copy keeps the lock
    logger.info("materialization %d of backend %s: written by process %d (nice +%d)",
                started.job.materialization_id, started.job.backend_id, process.pid, nice)
    return process


def main() -> int:
    """The job process: write the job named on standard input, exit 0 if it was written."""
    request: JobRequest = pickle.load(sys.stdin.buffer)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s [materialization process %(process)d]: "
               "%(message)s")
    # A hang-up (the executor's daemon stopping) ends the process even where the parent
    # ignored it; the alarm bounds a job whose brokers went away.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.alarm(max(1, int(request.deadline_s)))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signal, _frame: stop.set())
    path = Path(request.path)
    if request.nice:
        try:
            os.nice(request.nice)
        except OSError as exc:
            logger.warning("could not lower the priority by %d: %s", request.nice, exc)
    logger.info("writing %s at nice %d", path, os.nice(0))
    try:
        job = MaterializationJob.from_json((path / "job.json").read_text(encoding="utf-8"))
        snapshots = KafkaSnapshotStore(request.snapshots)
    except Exception as exc:
        logger.warning("materialization job %s not written: %s", path, exc)
        return 1
    try:
        handle = run_job(StartedJob(path, job, request.lock_fd), snapshots, stop)
    finally:
        snapshots.close()
    return 0 if handle is not None else 1


__all__ = ["JobRequest", "main", "spawn_job"]

if __name__ == "__main__":
    sys.exit(main())
