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

    def itertuples(self, index: bool = True, name: str | None = "Pandas"
                   ) -> Iterable[tuple[Any, ...]]:
        """The same tuples, in the same order, as ``pandas.DataFrame.itertuples``."""
        column_arrays = getattr(self, "_iter_column_arrays", None)
        if column_arrays is None:  # a pandas without it: pandas' own
            pandas_tuples: Iterable[tuple[Any, ...]] = super().itertuples(index, name)
            return pandas_tuples
        fields: list[Hashable] = list(self.columns)
        arrays = [_python_values(values) for values in column_arrays()]
        if index:
            arrays.insert(0, _python_values(self.index._values))
            fields.insert(0, "Index")
        if name is None:
            return zip(*arrays, strict=True)
        return map(_tuple_type(name, fields)._make, zip(*arrays, strict=True))


__all__ = ["KeyRows"]
