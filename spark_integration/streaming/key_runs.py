"""Runs of equal keys in a subtask's rows sorted by key: where each key's rows start,
and the key each run is for (as the user's function gets it)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from kafka_changelog.keys import decode_key


def run_starts(encoded: np.ndarray) -> np.ndarray:
    """The positions where a new key begins in ``encoded`` (each row's key bytes, sorted,
    not empty); a key's rows end where the next one's begin."""
    starts = np.empty(len(encoded), dtype=bool)
    starts[:1] = True
    starts[1:] = encoded[1:] != encoded[:-1]
    return np.flatnonzero(starts)


def keys_at(rows: pd.DataFrame, starts: np.ndarray, key_columns: Sequence[str],
            natural: Callable[[Any], Any]) -> list[Any]:
    """The key of each run: the key column's value at its start (``natural`` of it), or a
    tuple of the key columns' values."""
    firsts = rows.iloc[starts]
    if len(key_columns) == 1:
        return list(map(natural, firsts[key_columns[0]].tolist()))
    columns = [list(map(natural, firsts[c].tolist())) for c in key_columns]
    return list(zip(*columns, strict=True))


def natural_key_value(value: Any) -> Any:
    """A key column value as Python gives it: numpy scalars become ints, floats and
    bools; a floating-point key is the one value its key stands for (``-0.0`` as
    ``0.0``, any NaN as ``math.nan``)."""
    if isinstance(value, str):
        return value if type(value) is str else str(value)  # numpy's str_ as str
    item = getattr(value, "item", None)
    if item is not None and not isinstance(value, (bytes, pd.Timestamp)):
        value = item()
    if type(value) is float:
        return math.nan if value != value else value + 0.0  # -0.0 + 0.0 is 0.0
    return value


def key_value_of(key: bytes, key_types: Sequence[str]) -> Any:
    """A key as the stateful function gets it, from its bytes and its columns' types."""
    values = [natural_key_value(pd.Timestamp(v) if isinstance(v, dt.datetime) else v)
              for v in decode_key(key, key_types)]
    return values[0] if len(values) == 1 else tuple(values)


__all__ = ["key_value_of", "keys_at", "natural_key_value", "run_starts"]
