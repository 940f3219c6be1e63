"""Avro longs encoded column by column are exactly the per-value encoding."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kafka_changelog.avro_binary import zigzag_varint
from kafka_changelog.avro_columns import varint_rows

longs = st.integers(-(2**63), 2**63 - 1)
#: Columns of one length: arbitrary longs, small ones (the table), and one repeated value.
tables = st.integers(1, 60).flatmap(lambda rows: st.lists(
    st.one_of(
        st.lists(longs, min_size=rows, max_size=rows),
        st.lists(st.integers(-1, 9000), min_size=rows, max_size=rows),
        longs.map(lambda value: [value] * rows),
    ),
    min_size=1, max_size=5,
))


@given(tables)
def test_rows_are_the_concatenated_varints_of_their_values(columns: list[list[int]]) -> None:
    data, offsets = varint_rows([np.array(column, np.int64) for column in columns])
    rows = len(columns[0])
    expected = [b"".join(zigzag_varint(column[i]) for column in columns) for i in range(rows)]
    assert [data[offsets[i]:offsets[i + 1]] for i in range(rows)] == expected
    assert offsets[0] == 0 and offsets[-1] == len(data)


def test_no_rows() -> None:
    data, offsets = varint_rows([np.array([], np.int64)] * 3)
    assert data == b"" and offsets.tolist() == [0]


def test_a_padded_join_is_the_padded_buffer_of_the_join_without_a_second_copy() -> None:
    from kafka_changelog.avro_columns import PADDING, padded, padded_join

    parts = [b"\x02ab", b"", b"\xfe\xff\x01"]
    data, buffer, limit = padded_join(parts)
    expected, expected_limit = padded(b"".join(parts))
    assert limit == expected_limit == 6
    assert buffer.tolist() == expected.tolist()
    assert data[:limit] == b"".join(parts) and len(data) == limit + PADDING
    assert not buffer.flags.writeable  # a view of data, not a copy
