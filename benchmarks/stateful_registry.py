"""Sides of the Spark stateful benchmarks: what one side is, and a registry of them.

A side is a real Structured Streaming query over a benchmark's file source whose
outputs reach the benchmark's sink function (``sink(df, batch_id)``, a checksum per
batch). The Spark-only sides of a benchmark must be importable with nothing but
PySpark and pandas (they also run under the newest PySpark release, in a virtualenv
without this project's packages), so this module imports neither the library nor
PySpark.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BASELINE, OURS, SPARK = "baseline", "ours", "spark"
#: What a side's outputs hold per user: its totals over all batches, or of the batch.
CUMULATIVE, BATCH_ONLY = "cumulative", "batch"

SinkFn = Callable[[Any, int], None]


@dataclass
class RunContext:
    """What a side's query is built from, in the child process that runs it."""

    spark: Any
    #: The streaming DataFrame of the input files.
    source: Any
    #: The checksum sink every side's outputs go to.
    sink: SinkFn
    checkpoint_dir: str
    #: ``StreamingStateConfig`` fields of our sides (None for the others).
    state_config: dict[str, Any] | None = None
    #: A user whose state the side gets wrong on purpose (shows the checks catch it).
    corrupt_user: str | None = None
    #: Whatever the side keeps for later (ours: the processor, for its reports).
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Side:
    """One side of a benchmark."""

    name: str
    title: str
    role: str
    #: Which expected outputs the side's are checked against (a key of the case's).
    outputs: str
    #: Start the streaming query (its sink must be ``ctx.sink``); returns it.
    start: Callable[[RunContext], Any]
    #: The final state of the sampled users (``permille``), after the query stopped.
    read_state: Callable[[RunContext, int], dict[str, Any]] | None = None
    #: Why the side cannot run here (None: it can).
    unavailable: Callable[[], str | None] = lambda: None


def register(registry: dict[str, Side], side: Side) -> Side:
    """Add ``side`` to ``registry`` (names are unique)."""
    if side.name in registry:
        raise ValueError(f"a side named {side.name!r} is registered already")
    registry[side.name] = side
    return side


def protobuf_unavailable() -> str | None:
    """Why ``transformWithStateInPandas`` cannot run here (None: it can)."""
    try:
        importlib.import_module("google.protobuf.descriptor")
    except ImportError:
        return ("not available: transformWithStateInPandas needs the protobuf package "
                "(pip install 'protobuf>=6.33.5,<7', or put it on PYTHONPATH)")
    return None
