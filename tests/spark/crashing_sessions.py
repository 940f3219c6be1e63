"""The sessions job (``examples.sessions``) with a fault injected (crash tests of timers).

``python -m tests.spark.crashing_sessions [--kill-at EVENT:BATCH] [--kill-task-at
EVENT:BATCH:SUBTASK --fault-dir DIR] -- <sessions args...>``: the faults of
``tests.spark.crashing_clickstream`` (a driver killed with SIGKILL at a batch event, a
task's Python worker killed at a task event, once across retries).
"""

from __future__ import annotations

import argparse
import sys

from examples.sessions import main
from tests.spark.crashing_clickstream import kill_at, kill_tasks_at


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The fault options and the job's own arguments."""
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description="the sessions job with a fault injected")
    parser.add_argument("--kill-at", metavar="EVENT:BATCH")
    parser.add_argument("--kill-task-at", action="append", default=[],
                        metavar="TASK_EVENT:BATCH:SUBTASK")
    parser.add_argument("--fault-dir")
    return parser.parse_args(argv[:split]), argv[split + 1:]


if __name__ == "__main__":
    faults, job_args = parse(sys.argv[1:])
    listener = None
    if faults.kill_at:
        where, batch = faults.kill_at.split(":")
        listener = kill_at(where, int(batch))
    task_listener = None
    if faults.kill_task_at:
        if not faults.fault_dir:
            raise SystemExit("--kill-task-at needs --fault-dir")
        task_listener = kill_tasks_at(faults.kill_task_at, faults.fault_dir)
    sys.exit(main(job_args, listener=listener, task_listener=task_listener))
