"""The command line's pure parts: keys from arguments, decoded values, tables, options."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest

from kafka_changelog.cli.keyarg import (
    describe_key,
    encode_cli_key,
    key_types_to_use,
    split_types,
)
from kafka_changelog.cli.main import build_parser
from kafka_changelog.cli.options import (
    CliError,
    changelog_topic,
    connection,
    snapshot_topic,
)
from kafka_changelog.cli.output import age, size, table
from kafka_changelog.cli.values import Raw, decode_entry, to_json, to_text
from kafka_changelog.keys import KeyTypeError, encode_key, key_json
from kafka_changelog.state.schema.descriptors import StateKind
from kafka_changelog.state.schema.ops import StateMeta
from kafka_changelog.state.schema.serializers import FLOAT64, INT64, JSON, UTF8


def test_split_types_keeps_decimal_commas() -> None:
    assert split_types("string,decimal(10,2), bigint") == ["string", "decimal(10,2)", "bigint"]
    with pytest.raises(CliError, match="has an empty type"):
        split_types("string,,bigint")


@pytest.mark.parametrize(("values", "types", "python"), [
    (["user-1"], "string", ["user-1"]),
    (["42"], "bigint", [42]),
    (["-7"], "int", [-7]),
    (["true"], "boolean", [True]),
    (["00ff"], "binary", [b"\x00\xff"]),
    (["12.5"], "decimal(10,2)", [Decimal("12.5")]),
    (["2025-06-01"], "date", [dt.date(2025, 6, 1)]),
    (["2025-06-01T12:00:00Z"], "timestamp",
     [dt.datetime(2025, 6, 1, 12, tzinfo=dt.timezone.utc)]),
    (["2025-06-01T12:00:00"], "timestamp_ntz", [dt.datetime(2025, 6, 1, 12)]),
    (["eu,7"], "string,bigint", ["eu", 7]),
    (["eu", "7"], "string,bigint", ["eu", 7]),
    (["a,b"], "string", ["a,b"]),  # one string column: commas are part of the key
    (["eu,12.50"], "string,decimal(10,2)", ["eu", Decimal("12.50")]),
])
def test_keys_are_encoded_like_the_library(values: list[str], types: str,
                                           python: list[object]) -> None:
    assert encode_cli_key(values, types, None) == encode_key(python, split_types(types))


def test_key_types_come_from_the_checkpoint_unless_given() -> None:
    recorded = {"spark.key_types": '["string", "decimal(10,2)"]'}
    where = "checkpoint 3 of application 'shop'"
    assert key_types_to_use(None, recorded, where) == ["string", "decimal(10,2)"]
    assert key_types_to_use(None, {}, where) is None
    assert key_types_to_use("binary,decimal(12,2)", recorded, where) == [
        "binary", "decimal(12,2)"]  # same bytes for equal values
    assert key_types_to_use("bigint", {}, where) == ["bigint"]
    with pytest.raises(CliError, match=re.escape(
            "--key-type string,decimal(10,3): checkpoint 3 of application 'shop' records its "
            "key column type(s) as ['string', 'decimal(10,2)'] (property spark.key_types)")):
        key_types_to_use("string,decimal(10,3)", recorded, where)
    with pytest.raises(CliError, match="records its key column type"):
        key_types_to_use("string", recorded, where)  # one column for two
    with pytest.raises(CliError, match="has type map<string,int>, which cannot be a state"):
        key_types_to_use("map<string,int>", recorded, where)
    with pytest.raises(CliError, match=re.escape(
            "checkpoint 3 of application 'shop': checkpoint property spark.key_types is not "
            "a list of type names: '\"string\"'")):
        key_types_to_use(None, {"spark.key_types": '"string"'}, where)


def test_keys_are_described_by_their_types() -> None:
    key = encode_key(["eu", 7, dt.date(2025, 6, 1), b"\x01"],
                     ["string", "bigint", "date", "binary"])
    assert key_json(key, ["string", "bigint", "date", "binary"]) == [
        "eu", 7, "2025-06-01", "0x01"]
    assert describe_key(b"user-7", ["string"]) == '"user-7" (string; 0x757365722d37)'
    assert describe_key(encode_key([Decimal("2.50")], ["decimal(5,2)"]), ["decimal(5,2)"]) == (
        '"2.50" (decimal(5,2); 0x322e3530)')
    assert describe_key(encode_key([float("nan")], ["double"]), ["double"]) == (
        '"NaN" (double; 0x7ff8000000000000)')
    assert describe_key(b"\xff", ["string"]) == "0xff"  # not UTF-8: hex only
    assert describe_key(b"abc", ["bigint"]) == "0x616263"  # not 8 bytes
    assert describe_key(b"abc", None) == "0x616263"
    assert key_json(b"abc", None) is None


def test_key_hex_and_key_errors() -> None:
    assert encode_cli_key(None, "string", "0x757365722d31") == b"user-1"
    with pytest.raises(CliError, match="give either --key or --key-hex, not both"):
        encode_cli_key(["x"], "string", "00")
    with pytest.raises(CliError, match="give the key: --key VALUE"):
        encode_cli_key(None, "string", None)
    with pytest.raises(CliError, match=r"--key-type string,bigint has 2 column\(s\) but 3 key "
                                       r"value\(s\) were given: \['a', 'b', 'c'\]"):
        encode_cli_key(["a,b,c"], "string,bigint", None)
    with pytest.raises(CliError, match="key value 'x' is not a bigint"):
        encode_cli_key(["x"], "bigint", None)
    with pytest.raises(CliError, match="key value 'maybe' is not a boolean"):
        encode_cli_key(["maybe"], "boolean", None)
    with pytest.raises(CliError, match="a timestamp key needs a time zone"):
        encode_cli_key(["2025-06-01T12:00:00"], "timestamp", None)
    with pytest.raises(KeyTypeError, match="has type array<double>, which cannot be a state"):
        encode_cli_key(["1.5"], "array<double>", None)
    assert encode_cli_key(["-0.0"], "double", None) == b"\x00" * 8
    assert encode_cli_key(["nan"], "double", None) == bytes.fromhex("7ff8000000000000")
    assert encode_cli_key(["1.1"], "float", None) == bytes.fromhex("3ff19999a0000000")
    with pytest.raises(CliError, match="key value 'abc' is not a double"):
        encode_cli_key(["abc"], "double", None)


def test_entries_decode_by_serializer_name() -> None:
    value = StateMeta("v", StateKind.VALUE, "int64")
    assert decode_entry(value, INT64.serialize(-3)) == -3
    assert decode_entry(value, b"\x01") == Raw(b"\x01")  # not 8 bytes: shown raw
    floats = StateMeta("f", StateKind.VALUE, "float64")
    assert decode_entry(floats, FLOAT64.serialize(2.5)) == 2.5
    listed = StateMeta("l", StateKind.LIST, "utf8")
    assert decode_entry(listed, [UTF8.serialize("a"), b"\xff"]) == ["a", Raw(b"\xff")]
    mapped = StateMeta("m", StateKind.MAP, "json", "int64")
    entry = {INT64.serialize(2): JSON.serialize({"x": 1}), INT64.serialize(1): b"[]"}
    assert decode_entry(mapped, entry) == {1: [], 2: {"x": 1}}
    avro = StateMeta("a", StateKind.VALUE, "avro:0123456789abcdef")
    assert decode_entry(avro, b"\x02") == Raw(b"\x02")
    assert to_json({1: Raw(b"\x00"), "k": [Raw(b"\x01"), "s"]}) == {
        "1": {"base64": "AA=="}, "k": [{"base64": "AQ=="}, "s"]}
    assert to_text({Raw(b"\x0a"): 1.5, "k": [Raw(b"\x01"), "s"]}) == \
        '{"0x0a": 1.5, "k": [0x01, "s"]}'


def test_tables_ages_and_sizes() -> None:
    assert table(["A", "LONGER"], [["xyz", None], [1, "b"]]).splitlines() == [
        "A    LONGER", "xyz  -", "1    b"]
    assert [age(0, now) for now in (59_999, 61_000, 3_660_000, 90_000_000, -1)] == [
        "59s", "1m01s", "1h01m", "1d01h", "in the future"]
    assert [size(n) for n in (0, 1023, 1024, 1536, 5 * 1024**3)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 GiB"]


def test_shared_options_go_before_or_after_the_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    before = parser.parse_args(["-b", "h:1", "-X", "a=b", "--checkpoint-topic", "cp",
                                "verify", "app"])
    after = parser.parse_args(["verify", "app", "-b", "h:1", "-X", "a=b",
                               "--checkpoint-topic", "cp"])
    for args in (before, after):
        assert (args.bootstrap_servers, args.X, args.checkpoint_topic, changelog_topic(args),
                snapshot_topic(args), args.timeout) == (
            "h:1", ["a=b"], "cp", "kafka-changelog", "kafka-changelog-snapshots", 30.0)
        assert connection(args).settings() == {"bootstrap.servers": "h:1", "a": "b"}
    named = parser.parse_args(["reset", "app", "--changelog-topic", "log"])
    assert (named.changelog_topic, changelog_topic(named)) == ("log", "log")
    assert parser.parse_args(["reset", "app"]).changelog_topic is None  # not named: no GC
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(CliError, match="no broker: pass --bootstrap-servers or set "
                                       "KAFKA_BOOTSTRAP_SERVERS"):
        connection(parser.parse_args(["applications"]))
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env:9")
    assert connection(parser.parse_args(["applications"])).bootstrap_servers == "env:9"
    with pytest.raises(CliError, match="-X expects key=value, got 'oops'"):
        connection(parser.parse_args(["-X", "oops", "applications"]))
