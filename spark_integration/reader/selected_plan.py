"""A read of one checkpoint narrowed to the key groups pushed filters select (no pyspark).

:func:`plan_selected` plans as :func:`~.planning.plan_read` does, then keeps only the
key groups of :meth:`~.pushdown.KeySelection.groups`: in modes ``state`` and ``timers``
one task per contiguous run of them (its snapshot chunks and changelog narrowed by
``KeyedStateHandle.intersection``), in mode ``changes`` the offset slices of the
partitions holding them, filtered to them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .checkpoint_changes import committed_changes, selected_runs
from .planning import (
    MODE_CHANGES,
    MODE_TIMERS,
    ChangesTask,
    ReaderOptions,
    ReadPlan,
    StateTask,
    check_topics,
    existing_topics,
    key_types_of,
    load_checkpoint,
    plan_changes,
    plan_state,
    select_operators,
)

if TYPE_CHECKING:
    from .pushdown import KeySelection


def narrow_state(tasks: Sequence[StateTask], groups: frozenset[int]) -> list[StateTask]:
    """``tasks`` narrowed to ``groups``: one task per contiguous run of them."""
    narrowed = []
    for task in tasks:
        for run in selected_runs(task.key_groups, groups):
            handle = task.handle.intersection(run)
            if handle is not None:
                narrowed.append(dataclasses.replace(task, key_groups=run, handle=handle))
    return narrowed


def plan_selected(options: ReaderOptions, selection: KeySelection) -> tuple[ReadPlan, bool]:
    """The plan of a read of one checkpoint, and whether the selection narrowed it."""
    topics = existing_topics(options)
    checkpoint = load_checkpoint(options, topics)
    operators = select_operators(checkpoint, options.operator)
    check_topics(checkpoint, operators, options, topics)
    groups = selection.groups(checkpoint.max_parallelism, key_types_of(checkpoint))
    tasks: list[ChangesTask | StateTask]
    if options.mode == MODE_CHANGES:
        if groups is None:
            tasks = list(plan_changes(checkpoint, operators, options.slice_offsets))
        else:
            tasks = [ChangesTask(t.operator, t.subtask, t.slice, t.key_types)
                     for t in committed_changes(None, checkpoint, operators,
                                                options.slice_offsets, groups)]
    else:
        tasks = list(plan_state(checkpoint, operators, options.slice_key_groups,
                                timers=options.mode == MODE_TIMERS))
        if groups is not None:
            tasks = list(narrow_state([t for t in tasks if isinstance(t, StateTask)], groups))
    plan = ReadPlan(options.application, checkpoint.checkpoint_id, options.mode,
                    checkpoint.max_parallelism, tuple(operators), tuple(tasks))
    return plan, groups is not None


__all__ = ["narrow_state", "plan_selected"]
