"""The clickstream job with a fault injected (crash tests).

``python -m tests.spark.crashing_clickstream [--kill-at EVENT:BATCH] [--stall-dir DIR]
-- <clickstream args...>`` runs ``spark_integration.clickstream``:

- ``--kill-at``: with a batch listener that kills the driver process (SIGKILL) when
  it reaches ``EVENT`` (``batch_start``, ``before_commit``, ``in_transaction``,
  ``after_commit``) of batch ``BATCH``;
- ``--stall-dir``: with a stateful function that stalls one task in the middle of a
  batch, for the test to break something under it (kill -9 the worker running it, or
  a broker): the first call of the function after ``DIR/arm`` exists claims
  ``DIR/stalled`` (once, across all processes), writes its pid there and waits until
  ``DIR/release`` exists (at most 300 s) before doing its work.

``python -m tests.spark.crashing_clickstream EVENT:BATCH <clickstream args...>`` is
short for ``--kill-at EVENT:BATCH --``. Fault injection lives here, in the tests; the
library only offers the listener and takes the function. Run as ``__main__``, the
stalling function is pickled by value, so executors need not import this module.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from spark_integration.clickstream import main, update_user
from spark_integration.streaming import BATCH_EVENTS, BatchListener, StatefulFunction

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


def stall_once(directory: str) -> StatefulFunction:
    """``update_user`` that stalls one call (see the module docstring)."""

    def stalling(key: Any, rows: Any, state: Any) -> Any:
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
        return update_user(key, rows, state)

    return stalling


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The fault options and the clickstream's own arguments."""
    if argv and not argv[0].startswith("--"):
        argv = ["--kill-at", argv[0], "--", *argv[1:]]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description="the clickstream job with a fault injected")
    parser.add_argument("--kill-at", metavar="EVENT:BATCH")
    parser.add_argument("--stall-dir")
    return parser.parse_args(argv[:split]), argv[split + 1:]


if __name__ == "__main__":
    faults, job_args = parse(sys.argv[1:])
    listener = None
    if faults.kill_at:
        where, batch = faults.kill_at.split(":")
        listener = kill_at(where, int(batch))
    fn = stall_once(faults.stall_dir) if faults.stall_dir else update_user
    sys.exit(main(job_args, listener=listener, fn=fn))
