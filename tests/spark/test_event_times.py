"""Event times from a timestamp column of any pandas unit, with or without a time zone
(``spark_integration.streaming.event_times``): exact ms, and a clear refusal of columns
that hold no timestamps. No Spark session, no broker."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from spark_integration.streaming import EventTimeColumnError
from spark_integration.streaming.event_times import event_times_ms

#: 2026-01-01 00:00:00.123456789 UTC, and one instant before the epoch.
WHEN = pd.Series(pd.to_datetime(["2026-01-01 00:00:00.123456789", "1969-12-31 23:59:59.9995"]))
WHEN_MS = [1_767_225_600_123, -1]
#: The same in whole seconds (a [s] column holds no fraction).
WHEN_S_MS = [1_767_225_600_000, -1_000]
UNITS = ["s", "ms", "us", "ns"]


def expected(unit: str) -> list[int]:
    return WHEN_S_MS if unit == "s" else WHEN_MS


@pytest.mark.parametrize("unit", UNITS)
def test_a_naive_column_of_each_unit_is_read_as_utc(unit: str) -> None:
    column = WHEN.astype(f"datetime64[{unit}]")
    assert str(column.dtype) == f"datetime64[{unit}]"
    times = event_times_ms(column, "ts")
    assert times.dtype == np.int64
    assert times.tolist() == expected(unit)


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/New_York"])
def test_a_zoned_column_of_each_unit_gives_the_same_instants(unit: str, zone: str) -> None:
    column = WHEN.astype(f"datetime64[{unit}]").dt.tz_localize("UTC").dt.tz_convert(zone)
    assert str(column.dtype) == f"datetime64[{unit}, {zone}]"
    assert event_times_ms(column, "ts").tolist() == expected(unit)


def test_a_zoned_wall_clock_is_converted_to_utc() -> None:
    column = pd.Series(pd.to_datetime(["2026-01-01 05:30:00"]).astype("datetime64[ms]")
                       ).dt.tz_localize("Asia/Kolkata")
    assert event_times_ms(column, "ts").tolist() == [1_767_225_600_000]


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("zone", [None, "UTC"])
def test_pyarrow_backed_timestamps_are_read_in_their_unit(unit: str, zone: str | None) -> None:
    arrow = pa.array(WHEN.astype(f"datetime64[{unit}]"), pa.timestamp(unit, tz=zone))
    column = pd.Series(pd.arrays.ArrowExtensionArray(arrow))
    assert event_times_ms(column, "ts").tolist() == expected(unit)


def test_a_column_of_python_datetimes_is_read() -> None:
    column = pd.Series([dt.datetime(2026, 1, 1, 0, 0, 0, 123_456, tzinfo=dt.timezone.utc),
                        pd.Timestamp("2026-01-01 01:00:00.5", tz="Europe/Paris")],
                       dtype=object)
    assert event_times_ms(column, "ts").tolist() == [1_767_225_600_123, 1_767_225_600_500]


@pytest.mark.parametrize(("column", "dtype", "why"), [
    (pd.Series([1_767_225_600_123]), "int64", "it holds no timestamps"),
    (pd.Series([1.5]), "float64", "it holds no timestamps"),
    (pd.Series(["2026-01-01"]), "object",
     "it holds str values (e.g. '2026-01-01'), not datetimes"),
    (pd.Series([dt.date(2026, 1, 1)]), "object",
     "it holds date values (e.g. datetime.date(2026, 1, 1)), not datetimes"),
    (pd.Series(pd.to_timedelta([1], unit="s")), "timedelta64[ns]", "it holds no timestamps"),
    (pd.Series(pd.arrays.ArrowExtensionArray(pa.array([1], pa.int64()))), "int64[pyarrow]",
     "it holds no timestamps"),
])
def test_a_column_without_timestamps_is_refused_naming_it_and_its_dtype(
        column: pd.Series, dtype: str, why: str) -> None:
    with pytest.raises(EventTimeColumnError) as caught:
        event_times_ms(column, "seen_at")
    assert str(caught.value) == (
        f"event-time column 'seen_at' has dtype {dtype}, which cannot be read as event "
        f"times: {why}; give it a timestamp dtype (datetime64 of unit s, ms, us or ns, with "
        "or without a time zone), e.g. pd.to_datetime(rows[column], unit='ms', utc=True) "
        "for ms since the epoch")
