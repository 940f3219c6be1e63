"""What a stateful function returns, as output records (one dict per row)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

#: ``output_records``' key of a vectorised call (all of a subtask's rows, no one key).
ALL_KEYS: Any = object()


def output_records(produced: Any, key: Any = ALL_KEYS) -> list[dict[str, Any]]:
    """The rows a function returned: None (no rows), a DataFrame, a dict (one row) or an
    iterable of dicts. Anything else is a ``TypeError`` naming the call's ``key`` (for a
    per-key function) and what came back, instead of a failure later on rows that are
    not rows."""
    if produced is None:
        return []
    if isinstance(produced, pd.DataFrame):
        return produced.to_dict("records")  # type: ignore[no-any-return]
    if isinstance(produced, Mapping):
        return [dict(produced)]
    if isinstance(produced, (str, bytes)) or not hasattr(produced, "__iter__"):
        raise TypeError(_wrong(produced, key))
    records = list(produced)
    for row in records:
        if type(row) is not dict and not isinstance(row, Mapping):
            raise TypeError(_wrong(produced, key, row))
    return records


def _wrong(produced: Any, key: Any, row: Any = None) -> str:
    returned_for = "a subtask's rows" if key is ALL_KEYS else f"key {key!r}"
    what = (f"a {type(produced).__name__} holding {type(row).__name__} {row!r:.80}"
            if row is not None else f"{type(produced).__name__} {produced!r:.80}")
    return (f"the stateful function returned {what} for {returned_for}: return the "
            "output rows as a pandas DataFrame, a dict (one row), a list of dicts, or "
            "None (no rows)")
