"""Keep the Python worker's start-up objects out of its garbage collections.

A reused PySpark Python worker runs a full ``gc.collect()`` after every task. With
pyspark, pyarrow, NumPy, confluent-kafka and this library imported, a worker holds
~90k objects the collector walks each time: tens of milliseconds per task, for
objects that live as long as the worker. :func:`freeze_start_up_objects` moves
the objects alive at the worker's first read (modules, their constants) to the
collector's permanent generation (``gc.freeze``), once per process, so later
collections only walk what tasks allocate. Frozen objects are never collected: that
is only right for objects made before any task's data, which is why it runs once,
when a task of this reader starts in a fresh worker (after Spark's own collection).
"""

from __future__ import annotations

import gc
import os

_frozen_in: int | None = None


def freeze_start_up_objects() -> bool:
    """``gc.freeze()`` once per process (a forked worker counts as a new one); True if
    this call froze."""
    global _frozen_in
    pid = os.getpid()
    if _frozen_in == pid:
        return False
    _frozen_in = pid
    gc.freeze()
    return True


__all__ = ["freeze_start_up_objects"]
