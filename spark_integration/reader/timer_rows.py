"""Mode ``timers`` of ``format("kafka-changelog")``: the registered timers, decoded.

Timers are keyed state in a reserved map state (``__kc_timers``, see
:mod:`kafka_changelog.state.time.timers`) whose map keys encode each timer's domain and time;
mode ``state`` leaves that state out, and this mode shows it as one row per timer. The
Arrow schema is exactly what Spark derives from the reader's Spark schema
(``spark_integration.reader.datasource``; a test compares the two). No pyspark import.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from kafka_changelog.state.tables.protocol import KeyedStateTable
from kafka_changelog.state.time.timers import TIMERS_STATE, TimeDomain, parse_timer_map_key

from .change_schema import BATCH_ROWS
from .rows import decoded_keys

#: Mode ``timers``: one row per timer registered at the checkpoint.
TIMERS_SCHEMA = pa.schema([
    pa.field("operator", pa.string()),
    pa.field("key_group", pa.int32()),
    pa.field("key", pa.binary()),
    pa.field("key_decoded", pa.string()),
    # processing_time, event_time, or expiry (the backend's own TTL timers).
    pa.field("domain", pa.string()),
    pa.field("time", pa.timestamp("us", tz="UTC")),
    # Expiry timers: the TTL'd state whose entries they remove; null for users' timers.
    pa.field("state", pa.string()),
])

#: (operator, key group, key, domain, time in microseconds since the epoch, state)
TimerRow = tuple[str, int, bytes, str, int, str | None]


def timer_rows(table: KeyedStateTable, operator: str) -> Iterator[TimerRow]:
    """Every timer of ``table``, ordered by key group, key, domain (processing time, event
    time, expiry), time."""
    if TIMERS_STATE not in table.metas:
        return
    for key_group in table.key_groups():
        for key, entry in table.state_entries(key_group, TIMERS_STATE):
            assert isinstance(entry, dict)
            for map_key in sorted(entry):
                domain, time_ms, tag = parse_timer_map_key(map_key)
                state = tag.decode() if domain is TimeDomain.EXPIRY else None
                yield operator, key_group, key, domain.value, time_ms * 1000, state


def timer_rows_to_batch(rows: Sequence[TimerRow], key_types: Sequence[str] | None = None
                        ) -> pa.RecordBatch:
    """Timer rows as one record batch of :data:`TIMERS_SCHEMA` (``key_decoded`` from the
    key and ``key_types``)."""
    columns: list[list[Any]] = ([list(c) for c in zip(*rows, strict=True)] if rows
                                else [[] for _ in range(6)])
    operator, key_group, key, domain, time, state = columns
    arrays = [operator, key_group, key, decoded_keys(key, key_types), domain, time, state]
    return pa.RecordBatch.from_arrays(
        [pa.array(column, f.type) for column, f in zip(arrays, TIMERS_SCHEMA, strict=True)],
        schema=TIMERS_SCHEMA)


def timer_batches(table: KeyedStateTable, operator: str, batch_rows: int = BATCH_ROWS,
                  key_types: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of at most ``batch_rows`` rows of :func:`timer_rows`."""
    rows: list[TimerRow] = []
    for row in timer_rows(table, operator):
        rows.append(row)
        if len(rows) >= batch_rows:
            yield timer_rows_to_batch(rows, key_types)
            rows = []
    if rows:
        yield timer_rows_to_batch(rows, key_types)


__all__ = ["TIMERS_SCHEMA", "TimerRow", "timer_batches", "timer_rows", "timer_rows_to_batch"]
