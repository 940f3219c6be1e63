"""A Spark standalone cluster on this machine: one master and N workers, as local JVMs.

Example::

    with LocalSparkCluster(workers=2) as cluster:
        spark = spark_session(cluster.master_url, extra_config=cluster.session_config())
        ...
        cluster.kill_worker(0)      # kill -9 the worker, its executor and Python workers
        cluster.restart_worker(0)
        cluster.add_worker()        # one more worker (another host when hosts=True)

Every daemon is started from the installed PySpark (``pyspark/bin/spark-class
org.apache.spark.deploy.master.Master`` / ``...deploy.worker.Worker spark://HOST:PORT``)
on free loopback ports, each worker with its own work directory, ``cores_per_worker``
cores and ``worker_memory``. The processes get the guarantees of the local Kafka
brokers (:mod:`kafka_changelog.local_kafka.process`): own process group, a parent-death
signal, and a kill at interpreter exit or SIGTERM. Killing a worker (or stopping the
cluster) SIGKILLs the process groups of everything below it too: executors share the
worker's group, PySpark's Python daemons and workers have groups of their own.
Readiness is what the master reports on its JSON status page: ALIVE, with every
worker registered and ALIVE; a daemon that dies or a timeout raises
:class:`SparkClusterError` with the log tail.

With ``hosts=True`` every worker is a host of its own, as far as Spark and the library
can tell: worker ``i`` binds loopback address ``127.0.0.{i + 2}`` (its executors too, so
Spark's task locality sees distinct hosts) and has its own temp directory (``TMPDIR``, so
the default host-local state directory of ``state_backend="rocksdb"`` differs per
"host") and Spark local directory. Only loopback addresses are used.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from kafka_changelog.local_kafka import process
from kafka_changelog.local_kafka.errors import KafkaHarnessError
from kafka_changelog.local_kafka.jvm import find_java
from kafka_changelog.local_kafka.net import LOOPBACK, free_ports
from kafka_changelog.local_kafka.workdir import make_cluster_root, release_cluster_root

KEEP_DIR_ENV = "KAFKA_CHANGELOG_KEEP_CLUSTER_DIR"
"""Set to 1 to keep the cluster's directory (logs, work dirs) after ``stop()``."""

LOG_TAIL_LINES = 40
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

# Master and workers only schedule: a small heap, the serial collector and the C1 JIT
# start them sooner on a 2-core machine. No hsperfdata files in /tmp (kill -9 leaks them).
DAEMON_JAVA_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData"
# Executors of tests and demos run small batches: they too start sooner with C1 only.
EXECUTOR_JAVA_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData"
#: System property on every JVM of a cluster (value: its directory), so that leftovers are
#: recognisable by their command line (``scripts/test.sh`` looks for them).
TAG_PROPERTY = "kafka-changelog-spark-cluster"


class SparkClusterError(KafkaHarnessError):
    """The standalone cluster did not come up (or a worker did not come back).

    ``log_tail`` holds the last lines of the daemons' logs.
    """

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        self.log_tail = log_tail
        super().__init__(f"{message}\nlast log lines:\n{log_tail}" if log_tail else message)


@dataclass
class _Daemon:
    """One master or worker JVM."""

    name: str
    argv: list[str]
    directory: Path
    port: int
    webui_port: int
    #: Environment of this daemon beyond the cluster's (a worker's own host, temp dir).
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the daemon binds."""
        return (self.argv[self.argv.index("--host") + 1], self.port)

    @property
    def log(self) -> Path:
        return self.directory / "daemon.log"


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines))
    except OSError:
        return ""


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # exited meanwhile
        # The command name (field 2) may contain spaces: split after its ')'.
        parents[int(stat.parent.name)] = int(text.rsplit(")", 1)[1].split()[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pyspark_home() -> Path:
    """The installed PySpark's directory (``SPARK_HOME`` of a pip-installed Spark)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkClusterError("pyspark is not installed (pip install -e '.[spark]')")
    return Path(spec.origin).resolve().parent


class LocalSparkCluster:
    """A Spark standalone master and ``workers`` workers on loopback ports.

    Args:
        workers: number of workers.
        cores_per_worker: cores each worker offers (one executor per worker and app).
        worker_memory: memory each worker offers to executors.
        executor_memory: ``spark.executor.memory`` in :meth:`session_config`.
        startup_timeout: seconds for :meth:`start` (and each :meth:`restart_worker`).
        python: the interpreter of the executors' Python workers (default: this one).
        hosts: each worker on a loopback address and temp directory of its own (a host
            of its own for Spark's scheduler and for host-local state); else every
            worker on ``127.0.0.1``, sharing the machine's temp directory.

    ``stop()`` kills every daemon with its executors and deletes the directory; it
    also runs when ``start()`` fails, and at interpreter exit for clusters never stopped.
    """

    def __init__(
        self,
        workers: int = 2,
        cores_per_worker: int = 1,
        worker_memory: str = "1g",
        executor_memory: str = "640m",
        startup_timeout: float = 90.0,
        *,
        python: str | None = None,
        hosts: bool = False,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a cluster needs at least one worker, not {workers}")
        self.worker_count = workers
        self.cores_per_worker = cores_per_worker
        self.worker_memory = worker_memory
        self.executor_memory = executor_memory
        self.startup_timeout = startup_timeout
        self.python = python or sys.executable
        self.hosts = hosts
        self._root: Path | None = None
        self._master: _Daemon | None = None
        self._workers: list[_Daemon] = []
        self._env: dict[str, str] = {}

    # -- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = self.master_url if self._master is not None else "stopped"
        return f"LocalSparkCluster(workers={self.worker_count}, {state})"

    def start(self) -> LocalSparkCluster:
        """Launch the master, then the workers; return once all are registered and ALIVE.

        Raises:
            SparkClusterError: a daemon exited or the cluster was not ready within
                ``startup_timeout`` (with the log tail).
            ToolMissingError: no Java.
        """
        if self._master is not None:
            raise SparkClusterError(f"{self!r} is already started")
        try:
            deadline = time.monotonic() + self.startup_timeout
            self._prepare()
            assert self._master is not None
            self._launch(self._master)
            self._wait(lambda status: status.get("status") == "ALIVE", "the master is ALIVE",
                       deadline)
            for worker in self._workers:
                self._launch(worker)
            self._wait(lambda status: self._alive_ports(status) >= {
                w.address for w in self._workers}, f"{self.worker_count} workers are ALIVE",
                deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every daemon (with its executors) and delete the directory. Idempotent."""
        for daemon in [*self._workers, *([self._master] if self._master else [])]:
            if daemon.proc is not None:
                self._kill(daemon)
        self._workers = []
        self._master = None
        root, self._root = self._root, None
        if root is not None:
            process.untrack_directory(root)
            if os.environ.get(KEEP_DIR_ENV) == "1":
                release_cluster_root(root)
            else:
                shutil.rmtree(root, ignore_errors=True)

    # -- connection ----------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``, the master URL for sessions and ``--master``."""
        return f"spark://{LOOPBACK}:{self._started_master().port}"

    @property
    def cores(self) -> int:
        """Cores the workers offer in all."""
        return self.worker_count * self.cores_per_worker

    def session_config(self) -> dict[str, str]:
        """Spark settings for a driver of this cluster: loopback driver address, the
        executors' Python, modest executors of one core each."""
        return {
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            "spark.pyspark.python": self.python,
            "spark.executor.cores": str(self.cores_per_worker),
            "spark.executor.memory": self.executor_memory,
            "spark.cores.max": str(self.cores),
            "spark.executor.extraJavaOptions": f"{EXECUTOR_JAVA_OPTS} {self._tag()}",
        }

    def _tag(self) -> str:
        return f"-D{TAG_PROPERTY}={self._root}"

    def status(self) -> dict[str, Any]:
        """The master's JSON status (``workers``, ``activeapps``, ...)."""
        master = self._started_master()
        url = f"http://{LOOPBACK}:{master.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as answer:
            status: dict[str, Any] = json.load(answer)
        return status

    # -- workers -------------------------------------------------------------------

    def worker_pid(self, index: int) -> int | None:
        """Process id of worker ``index``'s JVM (its process group), None while killed."""
        proc = self._worker(index).proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def worker_of(self, pid: int) -> int | None:
        """The worker that ``pid`` (an executor or one of its Python workers) runs
        under, or None."""
        for index in range(len(self._workers)):
            worker_pid = self.worker_pid(index)
            if worker_pid is not None and pid in descendants(worker_pid):
                return index
        return None

    def kill_worker(self, index: int) -> int:
        """SIGKILL worker ``index`` with everything below it at once: its executors and
        their Python workers (a machine lost mid-task). Returns the worker's exit code."""
        worker = self._worker(index)
        if worker.proc is None:
            raise SparkClusterError(f"worker {index} of {self!r} is not running")
        code = self._kill(worker)
        return code

    def _kill(self, daemon: _Daemon) -> int:
        """SIGKILL ``daemon``'s process group and the groups of its descendants.

        Executors share the worker's group, but PySpark's daemon puts itself and its
        Python workers in a group of their own; it would only notice the executor's
        death when its stdin closes.
        """
        assert daemon.proc is not None
        groups = set()
        for pid in descendants(daemon.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
        groups.discard(os.getpgid(0))  # never our own (a child that did not setsid)
        code = process.kill(daemon.proc)
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        daemon.proc = None
        return code

    def restart_worker(self, index: int, timeout: float | None = None) -> None:
        """Start worker ``index`` again (same ports and work dir); return once the master
        lists it ALIVE."""
        worker = self._worker(index)
        if worker.proc is not None:
            self.kill_worker(index)
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        self._launch(worker)
        self._wait(lambda status: worker.address in self._alive_ports(status),
                   f"worker {index} is ALIVE again", deadline)

    def wait_for_executor(self, index: int, timeout: float | None = None) -> None:
        """Return once worker ``index`` runs an executor (the master counts its cores in
        use): an application that wants more cores got one there."""
        worker = self._worker(index)
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        self._wait(lambda status: int(
            self._alive(status).get(worker.address, {}).get("coresused", 0)) > 0,
            f"an executor on worker {index}", deadline)

    def add_worker(self, timeout: float | None = None) -> int:
        """Start one more worker (another host when ``hosts``); return its index once
        the master lists it ALIVE. Running applications get an executor on it when they
        may use more cores (``spark.cores.max``: see :meth:`session_config`)."""
        self._started_master()
        worker = self._new_worker(len(self._workers))
        self._workers.append(worker)
        self.worker_count += 1
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        self._launch(worker)
        self._wait(lambda status: worker.address in self._alive_ports(status),
                   f"worker {len(self._workers) - 1} is ALIVE", deadline)
        return len(self._workers) - 1

    def remove_worker(self) -> None:
        """Kill -9 the last worker (with everything below it) and forget it: the cluster
        has one worker less (the reverse of :meth:`add_worker`)."""
        worker = self._worker(len(self._workers) - 1)
        if worker.proc is not None:
            self._kill(worker)
        self._workers.pop()
        self.worker_count -= 1

    def worker_host(self, index: int) -> str:
        """The loopback address worker ``index`` binds (``127.0.0.1`` unless ``hosts``)."""
        if not self.hosts:
            return LOOPBACK
        if not 0 <= index < 253:
            raise ValueError(f"worker index {index} has no loopback address of its own")
        return f"127.0.0.{index + 2}"

    def worker_temp_dir(self, index: int) -> Path:
        """The temp directory of worker ``index``'s processes (its executors' and Python
        workers' ``tempfile.gettempdir()``)."""
        if not self.hosts:
            return Path(tempfile.gettempdir())
        return self._worker(index).directory / "tmp"

    def alive_workers(self) -> int:
        """Workers the master lists as ALIVE."""
        return len(self._alive_ports(self.status()))

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of every daemon's log."""
        daemons = [*([self._master] if self._master else []), *self._workers]
        return "".join(f"=== {d.name} ({d.log}) ===\n{_tail(d.log, lines) or '(empty)'}\n"
                       for d in daemons)

    # -- internals -----------------------------------------------------------------

    def _started_master(self) -> _Daemon:
        if self._master is None:
            raise SparkClusterError(f"{self!r} is not started")
        return self._master

    def _worker(self, index: int) -> _Daemon:
        self._started_master()
        if not 0 <= index < len(self._workers):
            raise IndexError(f"worker index {index} out of range 0..{len(self._workers) - 1}")
        return self._workers[index]

    def _prepare(self) -> None:
        """Directories, ports and command lines of every daemon; the daemons' environment."""
        home = pyspark_home()
        spark_class = home / "bin" / "spark-class"
        if not os.access(spark_class, os.X_OK):
            raise SparkClusterError(f"{spark_class} is missing or not executable")
        java = find_java()
        self._root = root = make_cluster_root()
        process.track_directory(root)
        ports = free_ports(2, LOOPBACK)
        master_dir = root / "spark-master"
        master_dir.mkdir()
        self._master = _Daemon("master", [
            str(spark_class), MASTER_CLASS, "--host", LOOPBACK, "--port", str(ports[0]),
            "--webui-port", str(ports[1])], master_dir, ports[0], ports[1])
        self._spark_class = spark_class
        for _ in range(self.worker_count):
            self._workers.append(self._new_worker(len(self._workers)))
        java_home = str(Path(java).resolve().parent.parent)
        self._env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "JAVA_HOME": os.environ.get("JAVA_HOME", java_home),
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": f"{DAEMON_JAVA_OPTS} {self._tag()}",
            # Executors' Python workers: this project's interpreter (the driver's
            # spark.pyspark.python says so too).
            "PYSPARK_PYTHON": self.python,
            "SPARK_CONF_DIR": str(root / "spark-conf"),  # no user spark-defaults.conf
        }
        (root / "spark-conf").mkdir()

    def _new_worker(self, index: int) -> _Daemon:
        """Directories, ports, command line and environment of worker ``index``."""
        assert self._root is not None and self._master is not None
        host = self.worker_host(index)
        directory = self._root / f"spark-worker-{index}"
        # A worker removed before had this index: the new one is another host, whose disk
        # holds nothing of it.
        shutil.rmtree(directory, ignore_errors=True)
        (directory / "work").mkdir(parents=True)
        port, webui = free_ports(2, host)
        env = {}
        if self.hosts:
            (directory / "tmp").mkdir()
            (directory / "local").mkdir()
            env = {"SPARK_LOCAL_IP": host, "TMPDIR": str(directory / "tmp"),
                   "SPARK_LOCAL_DIRS": str(directory / "local")}
        return _Daemon(f"worker {index}", [
            str(self._spark_class), WORKER_CLASS, "--host", host, "--port", str(port),
            "--webui-port", str(webui), "--cores", str(self.cores_per_worker),
            "--memory", self.worker_memory, "--work-dir", str(directory / "work"),
            f"spark://{LOOPBACK}:{self._master.port}"], directory, port, webui, env)

    def _launch(self, daemon: _Daemon) -> None:
        daemon.proc = process.spawn(daemon.argv, output=daemon.log, cwd=daemon.directory,
                                    env={**self._env, **daemon.env})

    def _check_alive(self) -> None:
        for daemon in [*([self._master] if self._master else []), *self._workers]:
            if daemon.proc is not None and daemon.proc.poll() is not None:
                code = daemon.proc.returncode
                daemon.proc = None
                raise SparkClusterError(f"the Spark {daemon.name} of {self!r} exited with "
                                        f"code {code}", log_tail=self.log_tail())

    @staticmethod
    def _alive(status: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
        """Every ALIVE worker's entry of the master's status, by (host, port)."""
        return {(str(w["host"]), int(w["port"])): w for w in status.get("workers", [])
                if w.get("state") == "ALIVE"}

    @classmethod
    def _alive_ports(cls, status: dict[str, Any]) -> set[tuple[str, int]]:
        """(host, port) of every ALIVE worker."""
        return set(cls._alive(status))

    def _wait(self, ready: Any, what: str, deadline: float) -> None:
        last = "no answer yet"
        while True:
            self._check_alive()
            try:
                status = self.status()
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = f"status page: {exc}"
            else:
                if ready(status):
                    return
                last = (f"master {status.get('status')}, workers "
                        f"{[(w.get('port'), w.get('state')) for w in status.get('workers', [])]}")
            if time.monotonic() > deadline:
                raise SparkClusterError(
                    f"{self!r}: not ready within {self.startup_timeout:.0f} s, waiting until "
                    f"{what} ({last})", log_tail=self.log_tail())
            time.sleep(0.25)


def main(argv: list[str] | None = None) -> int:
    """Run a local standalone cluster in the foreground until interrupted (Ctrl-C)."""
    import argparse

    parser = argparse.ArgumentParser(description="a local Spark standalone cluster")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="1g", help="memory per worker")
    args = parser.parse_args(argv)
    with LocalSparkCluster(args.workers, args.cores, args.memory) as cluster:
        print(f"master {cluster.master_url}; Ctrl-C stops the cluster", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
