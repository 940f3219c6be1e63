"""What a stateful function returns, as output records (one dict per row)."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

import pandas as pd

#: ``output_records``' key of a vectorised call (all of a subtask's rows, no one key).
ALL_KEYS: Any = object()


class OutputColumnsError(ValueError):
    """An output row's columns are not the ones ``output_schema`` names."""


def output_records(produced: Any, columns: Set[str] | None = None, key: Any = ALL_KEYS
                   ) -> list[dict[str, Any]]:
    """The rows a function returned: None (no rows), a DataFrame, a dict (one row) or an
    iterable of dicts, each with exactly ``columns`` (the output schema's names) when
    given. Anything else is a ``TypeError`` (not rows) or an :class:`OutputColumnsError`
    (a column missing or unknown, e.g. a typo that would otherwise leave a column null)
    naming the call's ``key`` (for a per-key function) and what came back."""
    if produced is None:
        return []
    if isinstance(produced, pd.DataFrame):
        if columns is not None and set(produced.columns) != columns:
            raise OutputColumnsError(_mismatch(list(produced.columns), columns, key))
        return produced.to_dict("records")  # type: ignore[no-any-return]
    if isinstance(produced, Mapping):
        records = [dict(produced)]
    elif isinstance(produced, (str, bytes)) or not hasattr(produced, "__iter__"):
        raise TypeError(_wrong(produced, key))
    else:
        records = list(produced)
    for row in records:
        if type(row) is not dict and not isinstance(row, Mapping):
            raise TypeError(_wrong(produced, key, row))
        if columns is not None and row.keys() != columns:
            raise OutputColumnsError(_mismatch(list(row), columns, key))
    return records


def _returned_for(key: Any) -> str:
    return "a subtask's rows" if key is ALL_KEYS else f"key {key!r}"


def _mismatch(found: list[Any], columns: Set[str], key: Any) -> str:
    unknown = sorted(str(c) for c in found if c not in columns)
    missing = sorted(c for c in columns if c not in found)
    problems = [f"{what} {names}" for what, names in (("unknown", unknown),
                                                       ("missing", missing)) if names]
    return (f"an output row for {_returned_for(key)} has columns {sorted(map(str, found))}, "
            f"but output_schema names {sorted(columns)}: {', '.join(problems)}. Return every "
            "output_schema column by name")


def _wrong(produced: Any, key: Any, row: Any = None) -> str:
    returned_for = _returned_for(key)
    what = (f"a {type(produced).__name__} holding {type(row).__name__} {row!r:.80}"
            if row is not None else f"{type(produced).__name__} {produced!r:.80}")
    return (f"the stateful function returned {what} for {returned_for}: return the "
            "output rows as a pandas DataFrame, a dict (one row), a list of dicts, or "
            "None (no rows)")
