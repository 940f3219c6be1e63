"""The vectorised entry point of stateful streaming: one call per subtask per batch.

With ``stateful_foreach_batch(..., vectorized=True)`` the user's function is
``fn(rows, state)``: ``rows`` are all of a subtask's rows of the micro-batch (user
columns only, sorted by key then ``order_by``, index ``0..n-1``) and ``state`` a
:class:`BatchState`, a :class:`~kafka_changelog.state.bulk_state.BulkState` over the
subtask's backend opened for the batch's distinct keys. The function folds rows with
pandas (``groupby`` aggregates) and reads and writes the state of many keys per call,
instead of being called once per key with a state object per call; it returns the
output rows (a DataFrame, a dict for one row, an iterable of dicts, or None), like the
per-key function.

The keys are given by their natural values, exactly as the per-key API gives them
(``str`` for a string column, ``int``,
``bytes``, ``Decimal``, ``datetime.date``, ``pandas.Timestamp``..., a tuple of them for
several key columns); the view maps each to the key bytes and key group Spark computed
for its rows. ``state.key_index`` gives the position in ``state.keys`` of each row's
key: ``rows.groupby(state.key_index)`` groups rows per key in the order of
``state.keys``, whatever the key columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Set
from typing import Any

import numpy as np
import pandas as pd

from kafka_changelog.state.bulk_state import BulkState
from kafka_changelog.state.keyed_backend import ChangelogKeyedStateBackend

from .key_runs import keys_at, run_starts
from .output_rows import output_records


class BatchState(BulkState):
    """The bulk state of one subtask's micro-batch: :attr:`keys` are the batch's distinct
    keys in key order (the order of the rows), and :attr:`key_index` maps each row to its
    key."""

    def __init__(self, backend: ChangelogKeyedStateBackend, keys: Iterable[Any],
                 key_bytes: Iterable[bytes], key_groups: Iterable[int],
                 key_index: np.ndarray[Any, Any]) -> None:
        super().__init__(backend, keys, key_bytes, key_groups)
        #: For each row of the function's ``rows``, the position of its key in ``keys``
        #: (ascending: rows are sorted by key).
        self.key_index = key_index


#: ``fn(rows, state) -> output rows`` (a DataFrame, a dict for one row, an iterable of
#: dicts, or None): a subtask's rows of the batch and the :class:`BatchState` of its keys.
VectorizedFunction = Callable[[pd.DataFrame, BatchState], Any]


def call_vectorized(fn: VectorizedFunction, backend: ChangelogKeyedStateBackend,
                    rows: pd.DataFrame, key_bytes: pd.Series, key_groups: pd.Series,
                    key_columns: Sequence[str], natural: Callable[[Any], Any],
                    output_columns: Set[str] | None = None
                    ) -> tuple[list[dict[str, Any]], int]:
    """Call ``fn`` once with ``rows`` (a subtask's non-empty batch, user columns, sorted
    by key bytes) and the :class:`BatchState` of their keys; ``key_bytes`` and
    ``key_groups`` are each row's state key and key group, ``natural`` turns a key
    column's value into the key the per-key API would give. Returns the output records
    (each with exactly ``output_columns``, if given) and the number of keys."""
    encoded = key_bytes.to_numpy()
    starts = run_starts(encoded)
    key_index = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(encoded))))
    keys = keys_at(rows, starts, key_columns, natural)
    state = BatchState(
        backend, keys, [k if type(k) is bytes else bytes(k) for k in encoded[starts]],
        key_groups.to_numpy()[starts].tolist(), key_index)
    produced = fn(rows.reset_index(drop=True), state)
    return output_records(produced, output_columns), len(keys)


__all__ = ["BatchState", "VectorizedFunction", "call_vectorized"]
