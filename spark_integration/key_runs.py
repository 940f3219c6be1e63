"""Runs of equal keys in a subtask's rows sorted by key: where each key's rows start,
and the key each run is for (as the user's function gets it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd


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


__all__ = ["keys_at", "run_starts"]
