"""The clickstream job with a fault injected (crash tests).

``python -m tests.spark.crashing_clickstream [--kill-at EVENT:BATCH] [--stall-dir DIR]
-- <clickstream args...>`` runs ``examples.clickstream``:

- ``--kill-at``: with a batch listener that kills the driver process (SIGKILL) when
  it reaches ``EVENT`` (``batch_start``, ``before_commit``, ``in_transaction``,
  ``after_commit``) of batch ``BATCH``;
- ``--stall-dir``: with a stateful function that stalls one task in the middle of a
  batch, for the test to break something under it (kill -9 the worker running it, or
  a broker): the first call of the function after ``DIR/arm`` exists claims
  ``DIR/stalled`` (once, across all processes), writes its pid there and waits until
  ``DIR/release`` exists (at most 300 s) before doing its work. With
  ``--stall-at EVENT``, the task stalls at that task event instead (e.g.
  ``subtask_committed``: its outputs are committed, the driver does not know yet);
- ``--kill-task-at EVENT:BATCH:SUBTASK`` (repeatable): a task listener that kills the
  Python worker running the task (SIGKILL) at that task event, once (across retries:
  a marker file in ``--fault-dir``); Spark then runs the task again;
- ``--initial-state FILE``: the application starts from the users' totals in ``FILE``
  (JSON lines ``user, events, spent``), read by a function of the batch's session, given to
  :func:`from_totals` (``initial_state``/``on_initial_state``);
- ``--sink-dir DIR``: outputs go to a sink function instead of ``KafkaOutputSink``,
  idempotent by checkpoint id as docs/streaming.md tells users: each call writes the batch's
  outputs to ``DIR/<checkpoint id>.json`` (replacing what a re-run of the checkpoint
  wrote) and appends ``<checkpoint id> <batch id>`` to ``DIR/calls.log``; with
  ``--kill-after-sink BATCH`` the driver is killed (once: a marker in ``DIR``) right
  after the sink's call for batch ``BATCH``, before Spark commits the batch.

``python -m tests.spark.crashing_clickstream EVENT:BATCH <clickstream args...>`` is
short for ``--kill-at EVENT:BATCH --``. Fault injection lives here, in the tests; the
library only offers the listener and takes the function. Run as ``__main__``, the
stalling function is pickled by value, so executors need not import this module.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from examples.clickstream import EVENTS, SPENT, main, update_user
from spark_integration.streaming import (
    BATCH_EVENTS,
    TASK_EVENTS,
    BatchListener,
    StatefulFunction,
    TaskListener,
)

#: How long a stalled task waits for ``release`` at most.
STALL_LIMIT_S = 300.0


def kill_at(event: str, batch_id: int) -> BatchListener:
    """A listener that SIGKILLs this process at ``event`` of batch ``batch_id``."""
    if event not in BATCH_EVENTS:
        raise ValueError(f"unknown batch event {event!r}; expected one of {BATCH_EVENTS}")

    def listener(seen: str, seen_batch: int) -> None:
        if (seen, seen_batch) == (event, batch_id):
            os.kill(os.getpid(), signal.SIGKILL)

    return listener


def kill_tasks_at(points: list[str], fault_dir: str) -> TaskListener:
    """A task listener that SIGKILLs the task's process at each ``EVENT:BATCH:SUBTASK`` of
    ``points``, once each (a marker in ``fault_dir`` survives the kill)."""
    wanted = set()
    for point in points:
        event, batch, subtask = point.split(":")
        if event not in TASK_EVENTS:
            raise ValueError(f"unknown task event {event!r}; expected one of {TASK_EVENTS}")
        wanted.add((event, int(batch), int(subtask)))

    def listener(event: str, batch_id: int, subtask: int) -> None:
        if (event, batch_id, subtask) not in wanted:
            return
        marker = Path(fault_dir) / f"killed-{event}-{batch_id}-{subtask}"
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            return  # killed once already: this is the retry
        os.kill(os.getpid(), signal.SIGKILL)

    return listener


def _stall(directory: str) -> None:
    """Stall here once across all processes (see the module docstring)."""
    folder = Path(directory)
    if (folder / "arm").exists() and not (folder / "stalled").exists():
            mine = folder / f"stalled-{os.getpid()}.tmp"
            mine.write_text(str(os.getpid()))
            try:
                os.link(mine, folder / "stalled")  # atomic: one claimant only
                claimed = True
            except FileExistsError:
                claimed = False
            mine.unlink()
            deadline = time.monotonic() + STALL_LIMIT_S
            while claimed and not (folder / "release").exists() and (
                    time.monotonic() < deadline):
                time.sleep(0.1)


def stall_once(directory: str) -> StatefulFunction:
    """``update_user`` that stalls one call (see the module docstring)."""

    def stalling(key: Any, rows: Any, state: Any) -> Any:
        _stall(directory)
        return update_user(key, rows, state)

    return stalling


def stall_at(directory: str, event: str) -> TaskListener:
    """A task listener that stalls one task at ``event`` (see the module docstring)."""
    if event not in TASK_EVENTS:
        raise ValueError(f"unknown task event {event!r}; expected one of {TASK_EVENTS}")

    def listener(seen: str, batch_id: int, subtask: int) -> None:
        if seen == event:
            _stall(directory)

    return listener


def file_sink(directory: str, kill_after_batch: int | None) -> Any:
    """The sink function of ``--sink-dir`` (see the module docstring)."""
    folder = Path(directory)

    def sink(outputs: Any, batch_id: int, checkpoint_id: int) -> None:
        rows = sorted([r["user"], r["events"], r["spent"]] for r in outputs.collect())
        written = folder / f".{checkpoint_id}-{os.getpid()}.tmp"
        written.write_text(json.dumps(rows))
        os.replace(written, folder / f"{checkpoint_id}.json")  # a re-run replaces it
        with open(folder / "calls.log", "a") as calls:
            calls.write(f"{checkpoint_id} {batch_id}\n")
        if batch_id == kill_after_batch:
            marker = folder / "killed"
            if not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)

    return sink


#: The columns of ``--initial-state``'s file.
TOTALS_SCHEMA = "user string, events long, spent double"


def from_totals(key: str, rows: Any, state: Any) -> None:
    """A user's state from its earlier totals (``on_initial_state``)."""
    state(EVENTS).update(int(rows["events"].sum()))
    state(SPENT).add(float(rows["spent"].sum()))


def totals_reader(path: str) -> Any:
    """``initial_state`` as a function of the session: the totals of ``path``."""
    def read(spark: Any) -> Any:
        return spark.read.schema(TOTALS_SCHEMA).json(path)
    return read


def fault_parser(description: str) -> argparse.ArgumentParser:
    """The options of the faults every crashing job takes: a driver kill at a batch event,
    task kills at task events (once each, across retries)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--kill-at", metavar="EVENT:BATCH")
    parser.add_argument("--kill-task-at", action="append", default=[],
                        metavar="TASK_EVENT:BATCH:SUBTASK")
    parser.add_argument("--fault-dir")
    return parser


def split_arguments(parser: argparse.ArgumentParser, argv: list[str]
                    ) -> tuple[argparse.Namespace, list[str]]:
    """The fault options (before ``--``) and the job's own arguments (after it)."""
    split = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:split]), argv[split + 1:]


def driver_kill(faults: argparse.Namespace) -> BatchListener | None:
    """The listener that kills the driver at ``--kill-at`` (None without it)."""
    if not faults.kill_at:
        return None
    where, batch = faults.kill_at.split(":")
    return kill_at(where, int(batch))


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The fault options and the clickstream's own arguments."""
    if argv and not argv[0].startswith("--"):
        argv = ["--kill-at", argv[0], "--", *argv[1:]]
    parser = fault_parser("the clickstream job with a fault injected")
    parser.add_argument("--stall-dir")
    parser.add_argument("--stall-at", metavar="TASK_EVENT")
    parser.add_argument("--sink-dir")
    parser.add_argument("--kill-after-sink", type=int, metavar="BATCH")
    parser.add_argument("--initial-state", metavar="FILE")
    return split_arguments(parser, argv)


if __name__ == "__main__":
    faults, job_args = parse(sys.argv[1:])
    listener = driver_kill(faults)
    fn: StatefulFunction = update_user
    task_listener: TaskListener | None = None
    if faults.stall_dir and faults.stall_at:
        task_listener = stall_at(faults.stall_dir, faults.stall_at)
    elif faults.stall_dir:
        fn = stall_once(faults.stall_dir)
    if faults.kill_task_at:
        if not faults.fault_dir or task_listener is not None:
            raise SystemExit("--kill-task-at needs --fault-dir and no --stall-at")
        task_listener = kill_tasks_at(faults.kill_task_at, faults.fault_dir)
    sink = file_sink(faults.sink_dir, faults.kill_after_sink) if faults.sink_dir else None
    initial = ({"initial_state": totals_reader(faults.initial_state),
                "on_initial_state": from_totals} if faults.initial_state else {})
    sys.exit(main(job_args, listener=listener, fn=fn, task_listener=task_listener, sink=sink,
                  **initial))
