"""The rows one per-key call gets: a pandas ``DataFrame`` whose ``itertuples`` is cheap.

A per-key function is called once per key with a handful of rows, and the usual way to
walk them, ``rows.itertuples()``, costs pandas ~0.2 ms per call whatever the row count: a
new namedtuple class on every call and a ``Series`` built per column. Over thousands of
keys per batch that was the largest single cost of a per-key batch (measured: more than
half of a task's time in the clickstream workload). :class:`KeyRows` gives the same tuples
from the frame as it is at the time of the call (edits made to it count), with the
namedtuple class made once per column list and the columns read as arrays.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np
import pandas as pd

#: Namedtuple classes by (name, fields); bounded, like any cache fed by user data.
_TUPLE_TYPES: dict[tuple[str, tuple[Any, ...]], Any] = {}
_TUPLE_TYPES_LIMIT = 256


def _tuple_type(name: str, fields: list[Any]) -> Any:
    key = (name, tuple(fields))
    found = _TUPLE_TYPES.get(key)
    if found is None:
        if len(_TUPLE_TYPES) >= _TUPLE_TYPES_LIMIT:
            _TUPLE_TYPES.clear()
        # As pandas does: rename=True turns labels that are not identifiers into _0, _1...
        found = _TUPLE_TYPES[key] = collections.namedtuple(name, fields, rename=True)
    return found


def _python_values(values: Any) -> list[Any]:
    """The values of one column as iterating its ``Series`` gives them: Python scalars
    from a NumPy array (``item`` of each, which is what ``tolist`` does), the extension
    array's own elements otherwise (timestamps, categories, ``pd.NA``...)."""
    if isinstance(values, np.ndarray):
        return values.tolist()  # type: ignore[no-any-return]
    return list(values)


class KeyRows(pd.DataFrame):  # type: ignore[misc]  # pandas is untyped here
    """One key's rows of a batch, as a per-key function gets them.

    A pandas ``DataFrame`` in every way (a copy the function may change), except that
    :meth:`itertuples` skips pandas' per-call costs. Frames made from it (selections,
    copies, sorts, arithmetic) are plain ``DataFrame`` objects.
    """

    @property
    def _constructor(self) -> Any:  # derived frames are plain DataFrames
        return pd.DataFrame

    @classmethod
    def copy_of_rows(cls, frame: pd.DataFrame, start: int, stop: int) -> KeyRows:
        """A copy of ``frame``'s rows ``start:stop`` (positions), as ``KeyRows``."""
        if _SLICE_MANAGER:
            # pandas' own iloc + copy, less its checks and intermediate frame: ~40% less
            # per key. Checked against iloc once at import (_manager_slice_works).
            manager = frame._mgr.get_slice(slice(start, stop), axis=1).copy(deep=True)
            rows: KeyRows = cls._from_mgr(manager, axes=manager.axes)
            return rows
        return cls(frame.iloc[start:stop], copy=True)

    def itertuples(self, index: bool = True, name: str | None = "Pandas"
                   ) -> Iterable[tuple[Any, ...]]:
        """The same tuples, in the same order, as ``pandas.DataFrame.itertuples``."""
        if not _COLUMN_ARRAYS:  # a pandas without them: pandas' own
            pandas_tuples: Iterable[tuple[Any, ...]] = super().itertuples(index, name)
            return pandas_tuples
        fields: list[Hashable] = list(self.columns)
        arrays = [_python_values(values) for values in self._iter_column_arrays()]
        if index:
            arrays.insert(0, _python_values(self.index._values))
            fields.insert(0, "Index")
        if name is None:
            return zip(*arrays, strict=True)
        return map(_tuple_type(name, fields)._make, zip(*arrays, strict=True))


def _manager_slice_works() -> bool:
    """Whether this pandas slices frames through its block manager as
    :meth:`KeyRows.copy_of_rows` does, giving what ``iloc`` and ``copy`` give."""
    if not hasattr(KeyRows, "_from_mgr"):
        return False
    sample = pd.DataFrame({"k": ["a", "b", "c"], "n": [1, 2, 3], "x": [0.5, 1.5, 2.5]},
                          index=[7, 8, 9])
    try:
        manager = sample._mgr.get_slice(slice(1, 3), axis=1).copy(deep=True)
        found = KeyRows._from_mgr(manager, axes=manager.axes)
        return (type(found) is KeyRows and found.equals(sample.iloc[1:3])
                and list(found.index) == [8, 9]
                and not np.shares_memory(found["n"].to_numpy(), sample["n"].to_numpy()))
    except (AttributeError, TypeError, ValueError):
        return False


#: What this pandas has, decided once (not per call).
_COLUMN_ARRAYS = hasattr(pd.DataFrame, "_iter_column_arrays")
_SLICE_MANAGER = _manager_slice_works()

__all__ = ["KeyRows"]
