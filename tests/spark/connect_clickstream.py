"""The clickstream job as a Spark Connect client, with its driver stalled once (tests).

``python -m tests.spark.connect_clickstream [--stall-dir DIR --stall-at EVENT] --
<clickstream args, --master sc://HOST:PORT>`` runs ``examples.clickstream`` from a Connect
client: the ``foreachBatch`` function (the stateful driver) runs in a Python process of
the server. With ``--stall-dir``, a batch listener stalls that driver once at batch event
``EVENT`` (e.g. ``before_commit``: every subtask committed its outputs, the checkpoint
record is not written) after ``DIR/arm`` exists: it claims ``DIR/stalled`` and waits for
``DIR/release`` (see ``tests.spark.crashing_clickstream``), for the test to kill the server
there. Run as ``__main__``, the listener is pickled by value; what it calls is imported on
the server (the repository is on the server workers' ``PYTHONPATH``).

Starting the query makes the server start the ``foreachBatch`` worker, which Spark gives
a fixed 10 s to connect back: on a loaded test machine its imports (PySpark's Connect
client, pandas, pyarrow) can take longer, and the start is then tried again (at most
:data:`START_TRIES` times in all; nothing ran yet).
"""

from __future__ import annotations

import argparse
import sys

from examples.clickstream import main
from spark_integration.streaming import BATCH_EVENTS, BatchListener
from tests.spark.crashing_clickstream import _stall, split_arguments


def stall_batch_at(directory: str, event: str) -> BatchListener:
    """A batch listener that stalls the driver once at ``event`` (module docstring)."""
    if event not in BATCH_EVENTS:
        raise ValueError(f"unknown batch event {event!r}; expected one of {BATCH_EVENTS}")

    def listener(seen: str, batch_id: int) -> None:
        if seen == event:
            _stall(directory)

    return listener


#: Starts of the query tried at most (module docstring).
START_TRIES = 8
#: Spark's error when the ``foreachBatch`` worker did not connect back in time.
WORKER_TIMEOUT = "Timed out while waiting for the Python worker to connect back"


def run(job_args: list[str], listener: BatchListener | None) -> int:
    """The clickstream's ``main``, its start tried again after a worker timeout."""
    for attempt in range(1, START_TRIES + 1):
        try:
            return main(job_args, listener=listener)
        except Exception as exc:
            if WORKER_TIMEOUT not in str(exc) or attempt == START_TRIES:
                raise
            print(f"start {attempt}: {WORKER_TIMEOUT}; starting again", file=sys.stderr,
                  flush=True)
    raise AssertionError("unreachable")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the clickstream job from a Connect client")
    parser.add_argument("--stall-dir")
    parser.add_argument("--stall-at", metavar="BATCH_EVENT")
    faults, job_args = split_arguments(parser, sys.argv[1:])
    listener = (stall_batch_at(faults.stall_dir, faults.stall_at)
                if faults.stall_dir and faults.stall_at else None)
    sys.exit(run(job_args, listener))
