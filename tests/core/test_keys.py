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
    key_encoding,
    key_json,
    key_text,
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
    # Java's Double.doubleToLongBits, big-endian; -0.0 is 0.0, every NaN one pattern.
    (1.5, "double", bytes.fromhex("3ff8000000000000")),
    (-2.0, "double", bytes.fromhex("c000000000000000")),
    (0.0, "double", b"\x00" * 8),
    (-0.0, "double", b"\x00" * 8),
    (float("nan"), "double", bytes.fromhex("7ff8000000000000")),
    (-float("nan"), "double", bytes.fromhex("7ff8000000000000")),
    (float("-inf"), "double", bytes.fromhex("fff0000000000000")),
    (5e-324, "double", b"\x00" * 7 + b"\x01"),
    (7, "double", bytes.fromhex("401c000000000000")),
    # A float column's value widened: the Python 1.1 stands for float32 1.1.
    (1.1, "float", bytes.fromhex("3ff19999a0000000")),
    (0.5, "float", bytes.fromhex("3fe0000000000000")),
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


@given(st.floats(allow_nan=False), st.floats(width=32, allow_nan=False))
def test_floating_point_keys_round_trip(double: float, single: float) -> None:
    types = ("double", "float")
    decoded = decode_key(encode_key((double, single), types), types)
    # -0.0 comes back as 0.0 (one key, as in Spark's groupBy)
    assert decoded == (double + 0.0, single + 0.0)
    assert [str(v) for v in decoded] == [str(double + 0.0), str(single + 0.0)]


def test_floating_point_keys_group_like_spark() -> None:
    assert encode_key((-0.0,), ("double",)) == encode_key((0.0,), ("double",))
    nan_key = encode_key((float("nan"),), ("double",))
    assert decode_key(nan_key, ("double",))[0] != decode_key(nan_key, ("double",))[0]  # NaN
    assert encode_key((float("-nan"),), ("double",)) == nan_key
    # A float key and the double of the same value are one key.
    assert encode_key((0.25,), ("float",)) == encode_key((0.25,), ("double",))
    with pytest.raises(KeyTypeError, match="value 'x' of key column 'price' is not a double"):
        encode_key(("x",), ("double",), ["price"])
    with pytest.raises(KeyTypeError, match="of key column 'f' is not a float"):
        encode_key((1e300,), ("float",), ["f"])  # beyond single precision


def test_null_and_complex_keys_are_refused_naming_the_column() -> None:
    with pytest.raises(NullKeyError, match="key column 'user_id' is null"):
        encode_key((None,), ("bigint",), ["user_id"])
    with pytest.raises(NullKeyError, match="key column 'price' is null"):
        encode_key((None,), ("double",), ["price"])
    with pytest.raises(KeyTypeError, match=r"'tags' has type array<string>.*float, double"):
        check_key_type("array<string>", "tags")
    with pytest.raises(KeyTypeError, match="needs a time zone"):
        encode_key_part(dt.datetime(2024, 1, 1), "timestamp")


@pytest.mark.parametrize(("value", "types"), [
    (7, ["tinyint", "smallint", "int", "bigint"]),
    (-3, ["int", "bigint"]),
    (0.5, ["float", "double"]),
    (Decimal("1.50"), ["decimal(10,2)", "decimal(12,2)", "decimal(3,2)"]),
])
def test_types_of_one_key_encoding_give_equal_values_equal_bytes(value: object,
                                                                 types: list[str]) -> None:
    assert len({key_encoding(t) for t in types}) == 1
    assert len({encode_key_part(value, t) for t in types}) == 1


def test_a_string_key_has_the_bytes_of_its_utf8_binary() -> None:
    assert key_encoding("string") == key_encoding("binary") == key_encoding("varchar(8)")
    assert encode_key_part("übung", "string") == encode_key_part("übung".encode(), "binary")


@pytest.mark.parametrize(("first", "second"), [
    ("int", "string"), ("date", "timestamp"), ("timestamp", "timestamp_ntz"),
    ("decimal(10,2)", "decimal(10,3)"), ("double", "bigint"), ("boolean", "tinyint"),
])
def test_types_of_other_key_encodings_differ(first: str, second: str) -> None:
    assert key_encoding(first) != key_encoding(second)


def test_keys_as_text_and_json_for_readers() -> None:
    assert key_text(b"user-7", ["string"]) == "user-7"
    assert key_text(encode_key([42], ["bigint"]), ["bigint"]) == "42"
    assert key_text(encode_key([True], ["boolean"]), ["boolean"]) == "true"
    assert key_text(encode_key([1.5], ["double"]), ["double"]) == "1.5"
    assert key_text(encode_key([float("inf")], ["double"]), ["double"]) == "Infinity"
    assert key_text(encode_key([dt.date(2025, 6, 1)], ["date"]), ["date"]) == "2025-06-01"
    moment = dt.datetime(2025, 6, 1, 12, 30, tzinfo=dt.timezone.utc)
    assert key_text(encode_key([moment], ["timestamp"]), ["timestamp"]) == (
        "2025-06-01T12:30:00+00:00")
    assert key_text(encode_key([b"\x00\xff"], ["binary"]), ["binary"]) == "0x00ff"
    assert key_text(encode_key([Decimal("-3.10")], ["decimal(6,2)"]), ["decimal(6,2)"]) == (
        "-3.10")
    composite = encode_key(["eu", 7, 2.0], ["string", "bigint", "double"])
    assert key_text(composite, ["string", "bigint", "double"]) == '["eu",7,2.0]'
    assert key_json(composite, ["string", "bigint", "double"]) == ["eu", 7, 2.0]
    assert key_text(b"abc", ["bigint"]) is None  # not 8 bytes: not a bigint key
    assert key_text(b"\xff", ["string"]) is None  # not UTF-8
    assert key_text(b"abc", None) is None
