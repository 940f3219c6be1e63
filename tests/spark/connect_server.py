"""A local Spark Connect server for the tests: started, killed -9 and restarted.

The server is ``spark_integration.sessions.connect_server``'s command line (PySpark's
``spark-submit`` of the Connect server, ``local[2]`` on 127.0.0.1 and a free port, the
Kafka connector's jars, this interpreter for the Python workers, the repository on their
``PYTHONPATH``), started with the guarantees of the local brokers
(:mod:`kafka_changelog.local_kafka.process`: own process group, parent-death signal,
killed at interpreter exit). Its JVM carries the tag of the tests' Spark JVMs
(``scripts/test.sh`` looks for leftovers). :meth:`LocalConnectServer.kill` SIGKILLs
the JVM's group and the groups of its descendants at once (PySpark's daemon puts its
Python workers in a group of their own), as a lost server machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from kafka_changelog.local_kafka import process
from kafka_changelog.local_kafka.net import LOOPBACK, free_ports
from spark_integration.sessions.connect_server import (
    ConnectServerConfig,
    server_command,
    server_environment,
)

from .jobs import NO_CODEGEN, REPO
from .standalone import LOG_TAIL_LINES, TAG_PROPERTY, SparkClusterError, _tail, descendants

#: The line the server logs once its gRPC service listens.
STARTED = "Spark Connect server started at"
#: The server JVM starts sooner with the C1 JIT and the serial collector (small tests).
SERVER_JAVA_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData"


class LocalConnectServer:
    """One Spark Connect server JVM (``local[2]``) on a free loopback port; a restart
    takes a new port (clients connect anew anyway)."""

    def __init__(self, start_timeout_s: float = 120.0) -> None:
        self.start_timeout_s = start_timeout_s
        self._root = Path(tempfile.mkdtemp(prefix="kc-connect-"))
        process.track_directory(self._root)
        self._proc: subprocess.Popen[bytes] | None = None
        self._config: ConnectServerConfig | None = None
        self.starts = 0

    def __enter__(self) -> LocalConnectServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``sc://127.0.0.1:PORT`` of the running server."""
        if self._config is None or self._proc is None:
            raise SparkClusterError("the Connect server is not running")
        return self._config.url

    @property
    def log(self) -> Path:
        return self._root / f"server-{self.starts}.log"

    def start(self) -> LocalConnectServer:
        """Start the server; return once its gRPC port accepts connections."""
        if self._proc is not None:
            raise SparkClusterError("the Connect server runs already")
        self.starts += 1
        config = ConnectServerConfig(
            port=free_ports(1)[0], host=LOOPBACK, master="local[2]",
            spark_config={"spark.local.dir": str(self._root / "local"),
                          "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
                          "spark.driver.memory": "1g", **NO_CODEGEN},
            java_options=f"-D{TAG_PROPERTY}={self._root} {SERVER_JAVA_OPTS}",
            python_path=(str(REPO),))
        self._config = config
        self._proc = process.spawn(server_command(config), output=self.log, cwd=REPO,
                                   env=server_environment(config))
        deadline = time.monotonic() + self.start_timeout_s
        while not (STARTED in _tail(self.log, LOG_TAIL_LINES) and _listens(config.port)):
            if self._proc.poll() is not None:
                self._proc = None
                raise SparkClusterError(f"the Connect server exited ({self.log})",
                                        log_tail=_tail(self.log, LOG_TAIL_LINES))
            if time.monotonic() > deadline:
                self.kill()
                raise SparkClusterError(
                    f"the Connect server did not start within {self.start_timeout_s} s",
                    log_tail=_tail(self.log, LOG_TAIL_LINES))
            time.sleep(0.2)
        return self

    def pids(self) -> list[int]:
        """The server JVM and every process below it (Python workers, daemons)."""
        if self._proc is None:
            return []
        return [self._proc.pid, *descendants(self._proc.pid)]

    def kill(self) -> int:
        """SIGKILL the server's process group and its descendants' groups at once; its
        exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return 0
        groups = set()
        for pid in descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
        groups.discard(os.getpgid(0))  # never the test's own
        code = process.kill(proc)
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        return code

    def stop(self) -> None:
        """Kill the server (if it runs) and delete its directory. Idempotent."""
        self.kill()
        process.untrack_directory(self._root)
        shutil.rmtree(self._root, ignore_errors=True)


def _listens(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((LOOPBACK, port)) == 0
