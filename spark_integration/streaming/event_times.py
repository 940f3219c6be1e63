"""Event times as ms since the epoch, from a timestamp column of whatever unit it has.

pandas keeps a timestamp column in the unit it was made with: ``datetime64[ns]`` from
Spark's Arrow batches, ``[us]`` from Python datetimes, ``[ms]`` or ``[s]`` from
``pd.read_parquet`` and numpy, each with or without a time zone (a naive time is UTC, as
everywhere in the streaming API). The watermark is in ms, so each column is converted by
its own unit; a column that holds no timestamps is refused, naming it and its dtype.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa

from .batch_time import EventTimeColumnError

#: Per pandas timestamp unit: (multiply by, then floor-divide by) to get ms.
_TO_MS: dict[str, tuple[int, int]] = {
    "s": (1000, 1),
    "ms": (1, 1),
    "us": (1, 1000),
    "ns": (1, 1_000_000),
}


def event_times_ms(values: pd.Series, column: str) -> np.ndarray:
    """``values`` (a timestamp column without nulls) as int64 ms since the epoch, floored.

    Reads ``datetime64`` of unit ``s``, ``ms``, ``us`` or ``ns`` with or without a time
    zone (naive: UTC), pyarrow-backed timestamps, and object columns of ``datetime``
    values; raises :class:`EventTimeColumnError` naming ``column`` and its dtype for
    anything else (numbers, strings, dates), whose meaning as a time would be a guess.
    """
    utc = _as_utc_datetime64(values, column)
    unit, count = np.datetime_data(utc.dtype)
    factors = _TO_MS.get(unit)
    if factors is None or count != 1:
        raise _unreadable(column, values.dtype, f"its unit {unit!r} is not one of "
                          f"{', '.join(_TO_MS)}")
    multiply, divide = factors
    return utc.view("int64") * multiply // divide


def _as_utc_datetime64(values: pd.Series, column: str) -> np.ndarray:
    """The column as a naive numpy ``datetime64`` array in UTC, in the column's unit."""
    dtype = values.dtype
    if isinstance(dtype, pd.ArrowDtype):
        arrow = dtype.pyarrow_dtype
        if not pa.types.is_timestamp(arrow):
            raise _unreadable(column, dtype, "it holds no timestamps")
        unit, tz = arrow.unit, arrow.tz
        target = pd.DatetimeTZDtype(unit, tz) if tz is not None else np.dtype(
            f"datetime64[{unit}]")
        return _as_utc_datetime64(values.astype(target), column)
    if isinstance(dtype, pd.DatetimeTZDtype):
        return np.asarray(values.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy())
    if isinstance(dtype, np.dtype) and dtype.kind == "M":
        return np.asarray(values.to_numpy())
    if isinstance(dtype, np.dtype) and dtype.kind == "O":
        other = next((v for v in values if not isinstance(v, dt.datetime)), None)
        if other is None:
            return _as_utc_datetime64(pd.to_datetime(values, utc=True), column)
        raise _unreadable(column, dtype, f"it holds {type(other).__name__} values "
                          f"(e.g. {other!r}), not datetimes")
    raise _unreadable(column, dtype, "it holds no timestamps")


def _unreadable(column: str, dtype: object, why: str) -> EventTimeColumnError:
    return EventTimeColumnError(
        f"event-time column {column!r} has dtype {dtype}, which cannot be read as event "
        f"times: {why}; give it a timestamp dtype (datetime64 of unit s, ms, us or ns, with "
        "or without a time zone), e.g. pd.to_datetime(rows[column], unit='ms', utc=True) "
        "for ms since the epoch")


__all__ = ["event_times_ms"]
