"""The clickstream job, killed with SIGKILL at one point of one batch (crash tests).

``python -m tests.spark.crashing_clickstream <event>:<batch id> <clickstream args...>``
runs ``spark_integration.clickstream`` with a batch listener that kills the process
when the driver reaches ``event`` (``batch_start``, ``before_commit``,
``in_transaction``, ``after_commit``) of batch ``batch id``. Fault injection lives
here, in the tests; the library only offers the listener.
"""

from __future__ import annotations

import os
import signal
import sys

from spark_integration.clickstream import main
from spark_integration.streaming import BATCH_EVENTS, BatchListener


def kill_at(event: str, batch_id: int) -> BatchListener:
    """A listener that SIGKILLs this process at ``event`` of batch ``batch_id``."""
    if event not in BATCH_EVENTS:
        raise ValueError(f"unknown batch event {event!r}; expected one of {BATCH_EVENTS}")

    def listener(seen: str, seen_batch: int) -> None:
        if (seen, seen_batch) == (event, batch_id):
            os.kill(os.getpid(), signal.SIGKILL)

    return listener


if __name__ == "__main__":
    where, batch = sys.argv[1].split(":")
    sys.exit(main(sys.argv[2:], listener=kill_at(where, int(batch))))
