"""The soak's Spark driver: the clickstream job as a child process, started, killed -9 or
stopped by the harness."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

from tests.spark.jobs import Job

from .processes import kill_tree


class SoakFailure(Exception):
    """The soak found state or outputs that differ from the model, or a part that died."""


class Driver:
    """One run of ``job`` at ``parallelism``; its output goes to ``log`` (and ``.err``)."""

    def __init__(self, job: Job, parallelism: int, log: Path) -> None:
        self.job = job
        self.parallelism = parallelism
        self.log = log
        self.proc: subprocess.Popen[str] = job.start(parallelism, None, log)

    @property
    def pid(self) -> int:
        """The job's process (its JVM runs below it)."""
        return self.proc.pid

    def check_alive(self) -> None:
        """Raise :class:`SoakFailure` (with the log's tail) if the job exited."""
        if self.proc.poll() is not None:
            tail = Path(f"{self.log}.err").read_text(errors="replace")[-3000:]
            raise SoakFailure(f"the driver exited with code {self.proc.returncode} "
                              f"unasked ({self.log}):\n{tail}")

    def kill(self) -> None:
        """kill -9 of the job's process and its JVM."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
        self.proc.wait()

    def stop(self, timeout_s: float = 90.0) -> None:
        """Stop the query as Ctrl-C does (``query.stop()``, ``spark.stop()``); kill -9
        after ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        self.kill()
