"""Initial state: a new application's state bootstrapped from a DataFrame in its first batch.

``stateful_foreach_batch(..., initial_state=df, on_initial_state=fn)``: in the first batch
of an application that has no checkpoint, the driver adds the rows of ``df`` (keyed like
the query: the same key column names and types) to the batch's rows, marked
(:data:`INITIAL_COLUMN`) and with their other columns renamed
(:data:`INITIAL_PREFIX`), so that they go to the subtask owning their key like any row.
Each task, before the batch's rows, calls ``fn(key, rows, state)`` once per key of them
(vectorised: ``fn(rows, state)`` once with all of them), with the key's initial rows under
their own column names; it writes state (and timers) and returns nothing.

Exactly once, at any parallelism: the initial rows belong to the batch that has no base
checkpoint, so a crash in it re-runs it from nothing (no state survives a batch that did
not commit), and the checkpoint it commits records that it applied them
(:data:`INITIAL_STATE_PROPERTY`, carried by every later checkpoint). A restart never
applies them again. An application that already has state not bootstrapped this way
(a checkpoint without the property) is refused with :class:`InitialStateError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kafka_changelog.errors import ChangelogError

from .columns import INPUT_COLUMNS

#: True on the initial state's rows (null on the batch's).
INITIAL_COLUMN = "__kc_initial"
#: The initial state's columns other than the key columns, renamed with this prefix on the
#: way to the tasks (they may share names with the batch's columns, with other types).
INITIAL_PREFIX = "__kc_init__"
#: The checkpoint property that says which checkpoint applied the initial state.
INITIAL_STATE_PROPERTY = "kafka_changelog.initial_state.checkpoint"

#: ``on_initial_state(key, rows, state) -> None`` (per key) or ``(rows, state) -> None``
#: (vectorised): writes the key's state from its initial rows.
InitialStateFunction = Callable[..., None]


class InitialStateError(ChangelogError):
    """The initial state cannot be applied: the application already has state, or the
    DataFrame is not keyed like the query."""


@dataclass(frozen=True)
class InitialState:
    """The initial state of a processor (driver side: the DataFrame is never pickled to
    the tasks). ``source``: a DataFrame, or a function of the batch's ``SparkSession``
    returning one (what a Spark Connect foreachBatch function, which runs in a process of
    its own, can carry)."""

    source: Any
    fn: InitialStateFunction

    def frame(self, spark: Any) -> Any:
        """The initial DataFrame (made in ``spark`` when the source is a function)."""
        return self.source(spark) if callable(self.source) else self.source


def initial_state_of(source: Any, fn: InitialStateFunction | None) -> InitialState | None:
    """The processor's initial state, its arguments checked (both or neither)."""
    if source is None and fn is None:
        return None
    if source is None or fn is None:
        raise ValueError("initial_state and on_initial_state go together: give both or "
                         f"neither (got initial_state={'set' if source is not None else None}, "
                         f"on_initial_state={'set' if fn is not None else None})")
    if not callable(fn):
        raise TypeError(f"on_initial_state must be callable, got {type(fn).__name__}")
    return InitialState(source, fn)


def check_applicable(application: str, base: int | None, base_properties: dict[str, str]
                     ) -> bool:
    """Whether this batch applies the initial state: only when the application has no
    checkpoint (``base`` None). With a base checkpoint that applied it, nothing more; one
    that did not (state from elsewhere) is refused."""
    if base is None:
        return True
    if INITIAL_STATE_PROPERTY in base_properties:
        return False
    raise InitialStateError(
        f"application {application!r} already has state (checkpoint {base}) that no "
        "initial state bootstrapped: initial_state applies only to a new application. "
        "Remove initial_state to continue from that state, or start a new application "
        "(another application name) to bootstrap it")


def initial_properties(applying: bool, checkpoint_id: int,
                       base_properties: dict[str, str]) -> dict[str, str]:
    """What the batch's checkpoint records about the initial state: the checkpoint that
    applied it (this one, or the base's record, carried on)."""
    if applying:
        return {INITIAL_STATE_PROPERTY: str(checkpoint_id)}
    found = base_properties.get(INITIAL_STATE_PROPERTY)
    return {INITIAL_STATE_PROPERTY: found} if found is not None else {}


def marked_rows(frame: Any, key_columns: list[str], key_types: list[str]) -> Any:
    """``frame`` ready to join the batch's rows: its key columns as they are (checked
    against the query's ``key_types``), its other columns renamed with
    :data:`INITIAL_PREFIX`, and :data:`INITIAL_COLUMN` set."""
    from pyspark.sql import functions as F

    fields = {f.name: f.dataType.simpleString() for f in frame.schema.fields}
    missing = [c for c in key_columns if c not in fields]
    if missing:
        raise InitialStateError(
            f"initial_state is not keyed like the query: it has no key column(s) {missing} "
            f"(its columns: {sorted(fields)})")
    wrong = [f"{c} ({fields[c]} in initial_state, {wanted} in the query)"
             for c, wanted in zip(key_columns, key_types, strict=True) if fields[c] != wanted]
    if wrong:
        raise InitialStateError(
            f"initial_state is not keyed like the query: key column(s) {', '.join(wrong)}")
    renamed = frame.select(*[F.col(f"`{c}`") for c in key_columns], *[
        F.col(f"`{c}`").alias(INITIAL_PREFIX + c) for c in frame.columns
        if c not in key_columns])
    return renamed.withColumn(INITIAL_COLUMN, F.lit(True))


def split_initial(rows: pd.DataFrame | None, key_columns: list[str]
                  ) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """A subtask's rows as (initial rows, batch rows): the initial ones with their key
    columns and their own column names (and the driver's internal columns), the batch's
    without the initial state's columns. (None, rows) when the batch carries no initial
    state."""
    if rows is None or INITIAL_COLUMN not in rows.columns:
        return None, rows
    # Null on the batch's rows (the union leaves it so): not initial.
    marked = rows[INITIAL_COLUMN].to_numpy(dtype=bool, na_value=False)
    initial_columns = [c for c in rows.columns if c.startswith(INITIAL_PREFIX)]
    batch = rows.loc[~marked].drop(columns=[*initial_columns, INITIAL_COLUMN])
    kept = [*key_columns, *(c for c in rows.columns
                            if c in INPUT_COLUMNS or c.startswith(INITIAL_PREFIX))]
    initial = rows.loc[marked, kept].rename(
        columns={c: c[len(INITIAL_PREFIX):] for c in initial_columns})
    return initial, batch


def refuse_outputs(produced: Any, where: str) -> None:
    """``on_initial_state`` returns nothing: anything else is refused, naming it."""
    if produced is None:
        return
    if isinstance(produced, pd.DataFrame) and produced.empty:
        return
    raise InitialStateError(
        f"on_initial_state returned {type(produced).__name__} for {where}: it writes state "
        "and returns nothing (outputs come from the batch's function)")


__all__ = ["INITIAL_COLUMN", "INITIAL_PREFIX", "INITIAL_STATE_PROPERTY", "InitialState",
           "InitialStateError", "InitialStateFunction", "check_applicable",
           "initial_properties", "initial_state_of", "marked_rows", "refuse_outputs",
           "split_initial"]
