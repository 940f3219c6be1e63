"""The state key encoding (kafka_changelog.keys): exact bytes, round trips, refusals."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_changelog import key_group_for_key
from kafka_changelog.keys import (
    KeyTypeError,
    NullKeyError,
    check_key_type,
    decode_key,
    encode_key,
    encode_key_part,
)

UTC = dt.timezone.utc


@pytest.mark.parametrize(("value", "type_name", "expected"), [
    ("user-1", "string", b"user-1"),
    ("é", "string", "é".encode()),
    (b"\x00\xff", "binary", b"\x00\xff"),
    (True, "boolean", b"\x01"),
    (False, "boolean", b"\x00"),
    (1, "tinyint", b"\x00" * 7 + b"\x01"),
    (-1, "int", b"\xff" * 8),
    (10**9, "bigint", (10**9).to_bytes(8, "big")),
    (-(2**63), "bigint", b"\x80" + b"\x00" * 7),
    (dt.date(1970, 1, 2), "date", b"\x00" * 7 + b"\x01"),
    (dt.date(1969, 12, 31), "date", b"\xff" * 8),
    (dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), "timestamp", (10**6).to_bytes(8, "big")),
    (dt.datetime(1970, 1, 1, 0, 0, 0, 1), "timestamp_ntz", b"\x00" * 7 + b"\x01"),
    (Decimal("12.5"), "decimal(10,2)", b"12.50"),
    (Decimal("-0.00"), "decimal(10,2)", b"0.00"),
    (Decimal("7"), "decimal(5,0)", b"7"),
])
def test_one_column_encodings_are_exactly_the_documented_bytes(
    value: object, type_name: str, expected: bytes
) -> None:
    assert encode_key((value,), (type_name,)) == expected
    assert encode_key_part(value, type_name) == expected


def test_string_keys_keep_the_key_group_of_their_utf8_bytes() -> None:
    # State written before typed keys (string keys as UTF-8) stays where it was.
    assert key_group_for_key(encode_key(("user-7",), ("string",)), 128) == \
        key_group_for_key(b"user-7", 128)


def test_composite_keys_frame_each_column_with_its_length() -> None:
    key = encode_key(("ab", 5), ("string", "bigint"))
    assert key == b"\x00\x00\x00\x02ab" + b"\x00\x00\x00\x08" + (5).to_bytes(8, "big")
    # Framing keeps ("a", "bc") and ("ab", "c") apart.
    assert encode_key(("a", "bc"), ("string", "string")) != \
        encode_key(("ab", "c"), ("string", "string"))
    assert decode_key(key, ("string", "bigint")) == ("ab", 5)


@given(st.integers(-(2**63), 2**63 - 1), st.text(), st.binary(), st.booleans(),
       st.dates(), st.datetimes(timezones=st.just(UTC)),
       st.decimals(min_value=-(10**6), max_value=10**6, places=3, allow_nan=False))
def test_every_type_round_trips(number: int, text: str, raw: bytes, flag: bool,
                                day: dt.date, instant: dt.datetime, amount: Decimal) -> None:
    types = ("bigint", "string", "binary", "boolean", "date", "timestamp", "decimal(12,3)")
    values = (number, text, raw, flag, day, instant, amount)
    decoded = decode_key(encode_key(values, types), types)
    assert decoded == values
    for value, type_name in zip(values, types, strict=True):
        assert decode_key(encode_key((value,), (type_name,)), (type_name,)) == (value,)


def test_null_and_float_keys_are_refused_naming_the_column() -> None:
    with pytest.raises(NullKeyError, match="key column 'user_id' is null"):
        encode_key((None,), ("bigint",), ["user_id"])
    with pytest.raises(KeyTypeError, match=r"'price' has type double.*cast it to decimal"):
        check_key_type("double", "price")
    with pytest.raises(KeyTypeError, match="'tags' has type array<string>"):
        check_key_type("array<string>", "tags")
    with pytest.raises(KeyTypeError, match="needs a time zone"):
        encode_key_part(dt.datetime(2024, 1, 1), "timestamp")
