"""State keys of a streaming query, computed by Spark SQL from the key columns.

The encoding is ``kafka_changelog.keys`` (version 1): this module writes it as
Spark SQL expressions, so that the key bytes and the key group of every row come
from Spark, never from a Python re-encoding of what pandas made of the value
(pandas turns a nullable ``long`` column into floats, a timestamp into the session
time zone's wall clock). A null in a key column gives a null key column, which the
task refuses with :class:`~kafka_changelog.keys.NullKeyError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kafka_changelog.keys import check_key_type


def _eight_bytes(long_expr: str) -> str:
    # hex() of a bigint is its two's complement in 16 hex digits when negative.
    return f"unhex(lpad(hex(cast({long_expr} AS BIGINT)), 16, '0'))"


def key_part_sql(column: str, type_name: str) -> str:
    """Spark SQL for the encoding of one key column (null stays null)."""
    name = check_key_type(type_name, column)
    col = f"`{column.replace('`', '``')}`"
    if name == "string":
        return f"CAST({col} AS BINARY)"
    if name == "binary":
        return col
    if name == "boolean":
        return f"CASE WHEN {col} THEN X'01' WHEN NOT {col} THEN X'00' END"
    if name == "date":
        return _eight_bytes(f"unix_date({col})")
    if name == "timestamp":
        return _eight_bytes(f"unix_micros({col})")
    if name == "timestamp_ntz":
        # Wall-clock microseconds, without any time zone: days, then time of day.
        # Every factor a BIGINT (Spark 4's generated code overflowed int * bigint here).
        micros = (f"CAST(unix_date(CAST({col} AS DATE)) AS BIGINT) * 86400000000"
                  f" + CAST(hour({col}) AS BIGINT) * 3600000000"
                  f" + CAST(minute({col}) AS BIGINT) * 60000000"
                  f" + CAST(date_part('SECOND', {col}) * 1000000 AS BIGINT)")
        return f"CASE WHEN {col} IS NOT NULL THEN {_eight_bytes(micros)} END"
    if name.startswith("decimal"):
        return f"CAST(CAST({col} AS STRING) AS BINARY)"
    if name in ("float", "double"):
        # The double's bits as Java gives them (every NaN alike), -0.0 as 0.0 (equal
        # to 0 in SQL); a float widens to double exactly. reflect fails on a null.
        value = f"CAST({col} AS DOUBLE)"
        bits = (f"reflect('java.lang.Double', 'doubleToLongBits', "
                f"CASE WHEN {value} = 0 THEN 0.0D ELSE {value} END)")
        return f"CASE WHEN {col} IS NOT NULL THEN {_eight_bytes(bits)} END"
    return _eight_bytes(col)


def key_sql(columns: Sequence[str], type_names: Sequence[str]) -> str:
    """Spark SQL for the state key of a row (see ``kafka_changelog.keys``)."""
    parts = [key_part_sql(c, t) for c, t in zip(columns, type_names, strict=True)]
    if len(parts) == 1:
        return parts[0]
    # concat is null as soon as one part is: a null in any key column is a null key.
    framed = [f"unhex(lpad(hex(octet_length({p})), 8, '0')), {p}" for p in parts]
    return f"concat({', '.join(framed)})"


def key_columns_of(schema: Any, key_column: str | Sequence[str]) -> tuple[list[str], list[str]]:
    """The key column names and their Spark type names, checked against ``schema``."""
    columns = [key_column] if isinstance(key_column, str) else list(key_column)
    if not columns:
        raise ValueError("at least one key column is needed")
    fields = {f.name: f for f in schema.fields}
    types = []
    for column in columns:
        field = fields.get(column)
        if field is None:
            raise ValueError(
                f"key column {column!r} is not a column of the stream; its columns are "
                f"{sorted(fields)}")
        types.append(check_key_type(field.dataType.simpleString(), column))
    return columns, types
