"""The sessions job (``examples.sessions``) with a fault injected (crash tests of timers).

``python -m tests.spark.crashing_sessions [--kill-at EVENT:BATCH] [--kill-task-at
EVENT:BATCH:SUBTASK --fault-dir DIR] [--reminders] -- <sessions args...>``: the faults of
``tests.spark.crashing_clickstream`` (a driver killed with SIGKILL at a batch event, a
task's Python worker killed at a task event, once across retries).

``--reminders`` adds processing-time timers to the job: every batch with clicks of a user
registers a reminder at the batch's processing time + 1 ms (so it is due in the user's
next batch, input or not), and the reminder writes ``user, start=<timer time>, end=-1,
clicks=<clicks since the previous reminder>`` and sets the count back to zero. So per
user, the clicks of all committed reminders plus the count left in the state
(:data:`SINCE_REMINDER`) equal the user's clicks exactly when every reminder fired once.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pandas as pd

from examples.sessions import close_session, main, update_session
from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import INT64
from kafka_changelog.state.time.timers import TimeDomain
from spark_integration.streaming import KeyState, TimerInfo
from tests.spark.crashing_clickstream import (
    driver_kill,
    fault_parser,
    kill_tasks_at,
    split_arguments,
)

#: A user's clicks since its last reminder (``--reminders``).
SINCE_REMINDER = value_state("clicks_since_reminder", INT64)


def update_with_reminder(user: str, rows: pd.DataFrame, state: KeyState
                         ) -> list[dict[str, Any]] | None:
    """:func:`update_session`, and a processing-time reminder in the next batch."""
    sessions = update_session(user, rows, state)
    since = state(SINCE_REMINDER)
    since.update((since.value() or 0) + len(rows))
    state.timers.register_processing_time(state.context.processing_time_ms + 1)
    return sessions


def remind_or_close(user: str, timer: TimerInfo, state: KeyState) -> dict[str, Any]:
    """A reminder (processing time) or a session's end (event time)."""
    if timer.domain is not TimeDomain.PROCESSING_TIME:
        return close_session(user, timer, state)
    since = state(SINCE_REMINDER)
    clicks = since.value() or 0
    since.clear()
    return {"user": user, "start": timer.time_ms, "end": -1, "clicks": clicks}


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The fault options and the job's own arguments."""
    parser = fault_parser("the sessions job with a fault injected")
    parser.add_argument("--reminders", action="store_true")
    return split_arguments(parser, argv)


if __name__ == "__main__":
    faults, job_args = parse(sys.argv[1:])
    listener = driver_kill(faults)
    task_listener = None
    if faults.kill_task_at:
        if not faults.fault_dir:
            raise SystemExit("--kill-task-at needs --fault-dir")
        task_listener = kill_tasks_at(faults.kill_task_at, faults.fault_dir)
    functions: dict[str, Any] = {}
    if faults.reminders:
        functions = {"update": update_with_reminder, "on_timer": remind_or_close}
    sys.exit(main(job_args, listener=listener, task_listener=task_listener, **functions))
