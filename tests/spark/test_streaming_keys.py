"""Stateful streaming keyed on any Spark atomic type, on several columns, and nulls.

The state key is computed by Spark SQL (``spark_integration.keys``) and must equal
the documented Python encoding (``kafka_changelog.keys``), its key group must be
Spark's ``pmod(hash(key), max_parallelism)``, and the function gets the key as its
Python value. A null key fails the batch naming the column: never dropped.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kafka_changelog import key_group_for_key, key_group_range_for_operator
from kafka_changelog.keys import NullKeyError, decode_key, encode_key
from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import INT64
from spark_integration.keys import key_sql
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.worker_resources import WorkerResources

pytestmark = [pytest.mark.spark]

COUNT = value_state("count", INT64)
UTC = dt.timezone.utc

# type -> three distinct keys (one of each is given two rows per batch)
KEYS: dict[str, list[Any]] = {
    "string": ["a", "é", ""],
    "binary": [b"\x00", b"\xff\x01", b""],
    "boolean": [True, False],
    "tinyint": [1, -1, 127],
    "smallint": [-32768, 0, 300],
    "int": [0, -5, 2**31 - 1],
    "bigint": [10**9, -(2**62), 2**62 + 7],
    "decimal(10,2)": [Decimal("1.50"), Decimal("-3.00"), Decimal("0.00")],
    "date": [dt.date(2024, 1, 1), dt.date(1969, 12, 31), dt.date(2000, 2, 29)],
    "timestamp": [dt.datetime(2024, 1, 1, 12, 0, 0, 1, tzinfo=UTC),
                  dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC),
                  dt.datetime(2030, 6, 1, tzinfo=UTC)],
    "timestamp_ntz": [dt.datetime(2024, 1, 1, 12, 30), dt.datetime(1960, 5, 5, 0, 0, 0, 5),
                      dt.datetime(2099, 12, 31, 23, 59, 59, 999999)],
    "double": [1.5, -2.25e-300, float("inf")],
    "float": [1.1, -0.5, 3.4e38],
}


def count_rows(key: Any, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
    count = state(COUNT)
    count.update((count.value() or 0) + len(rows))
    return [{"k": repr(key), "n": count.value(), "pytype": type(key).__name__}]


def app_config(cluster: Any, prefix: str, parallelism: int = 2) -> StreamingStateConfig:
    return StreamingStateConfig(
        application=prefix, operator_id="op", bootstrap_servers=cluster.bootstrap_servers,
        parallelism=parallelism, changelog_topic=f"{prefix}-changelog",
        snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
        partitions=4, materialization_interval_s=None)


def count_batches(config: StreamingStateConfig, frames: list[Any]) -> dict[int, pd.DataFrame]:
    """Run ``count_rows`` keyed on column ``k`` (rows ordered by ``x``) over ``frames`` as
    batches 0, 1, ...; each batch's outputs."""
    outputs: dict[int, pd.DataFrame] = {}
    with stateful_foreach_batch(
        config, count_rows, "k", "k string, n long, pytype string",
        sink=lambda out, batch_id: outputs.__setitem__(batch_id, out.toPandas()),
        order_by=["x"],
    ) as processor:
        for batch_id, frame in enumerate(frames):
            processor(frame, batch_id)
    return outputs


def restored_counts(config: StreamingStateConfig, keys: list[bytes]) -> dict[bytes, int | None]:
    coordinator = WorkerResources.coordinator(config)
    backend = coordinator.restore_keyed(
        config.operator_id, key_group_range_for_operator(config.max_parallelism, 1, 0),
        coordinator.checkpoint(), config.changelog())
    try:
        counts = {}
        for key in keys:
            backend.set_current_key(key)
            counts[key] = backend.state(COUNT).value()
        return counts
    finally:
        backend.close()


def test_spark_sql_encodes_keys_exactly_as_python_does(spark: Any) -> None:
    for type_name, values in KEYS.items():
        df = spark.createDataFrame([(v,) for v in values], f"k {type_name}")
        got = [bytes(r[0]) for r in df.selectExpr(key_sql(["k"], [type_name])).collect()]
        assert got == [encode_key((v,), (type_name,)) for v in values], type_name
    pairs = spark.createDataFrame([("x", 5), ("", -1)], "a string, b bigint")
    got = [bytes(r[0]) for r in pairs.selectExpr(key_sql(["a", "b"], ["string", "bigint"]))
           .collect()]
    assert got == [encode_key(("x", 5), ("string", "bigint")),
                   encode_key(("", -1), ("string", "bigint"))]
    nulls = spark.createDataFrame([(None, 1)], "a string, b bigint")
    assert nulls.selectExpr(key_sql(["a", "b"], ["string", "bigint"])).collect()[0][0] is None
    doubles = spark.createDataFrame([(-0.0,), (float("nan"),), (None,)], "k double")
    assert [r[0] for r in doubles.selectExpr(key_sql(["k"], ["double"])).collect()] == [
        bytearray(8), bytearray.fromhex("7ff8000000000000"), None]


@pytest.mark.broker
def test_floating_point_keys_group_as_spark_groups_them(spark: Any,
                                                        kafka_cluster: Any) -> None:
    prefix = f"fkeys-{uuid.uuid4().hex[:8]}"
    config = app_config(kafka_cluster, prefix)
    rows = [(-0.0, 1), (0.0, 2), (float("nan"), 3), (float("-nan"), 4), (2.5, 5)]
    frame = spark.createDataFrame(rows, "k double, x long")
    spark_groups = sorted((r["count"], str(r["k"])) for r in frame.groupBy("k").count()
                          .collect())
    outputs = count_batches(config, [frame])
    ours = sorted((int(n), k) for n, k in zip(outputs[0]["n"], outputs[0]["k"], strict=True))
    assert ours == [(1, "2.5"), (2, "0.0"), (2, "nan")]
    assert [(n, k.lower()) for n, k in ours] == [(n, k.lower()) for n, k in spark_groups]
    keys = [encode_key((v,), ("double",)) for v in (0.0, float("nan"), 2.5)]
    assert restored_counts(config, keys) == dict(zip(keys, [2, 2, 1], strict=True))
    WorkerResources.release(config)

    # The vectorised view has the same keys: 0.0 (not the first row's -0.0) and math.nan,
    # so a lookup with math.nan finds the NaN key's state.
    def vectorized(rows: pd.DataFrame, state: Any) -> pd.DataFrame:
        counts = state.value(COUNT)
        counts.set(state.keys, np.bincount(state.key_index).tolist())
        # Only the subtask that has the NaN key may look it up.
        nan_count = counts.get([math.nan])[0] if math.nan in state else -1
        return pd.DataFrame({"k": [repr(k) for k in state.keys],
                             "nan_count": [nan_count] * len(state.keys)})

    config = app_config(kafka_cluster, f"{prefix}-v")
    seen: list[pd.DataFrame] = []
    with stateful_foreach_batch(config, vectorized, "k", "k string, nan_count long",
                                sink=lambda out, _: seen.append(out.toPandas()),
                                vectorized=True) as processor:
        processor(frame, 0)
    assert sorted(seen[0]["k"]) == ["0.0", "2.5", "nan"]
    assert set(seen[0].loc[seen[0]["k"] == "nan", "nan_count"]) == {2}
    WorkerResources.release(config)


@pytest.mark.broker
@pytest.mark.parametrize("type_name", list(KEYS))
def test_every_key_type_keeps_its_own_state(spark: Any, kafka_cluster: Any,
                                            type_name: str) -> None:
    prefix = f"keys-{uuid.uuid4().hex[:8]}"
    config = app_config(kafka_cluster, prefix)
    values = KEYS[type_name]
    rows = [(v, i) for i, v in enumerate(values)] + [(values[0], 99)]
    frame = spark.createDataFrame(rows, f"k {type_name}, x long")
    outputs = count_batches(config, [frame, frame])
    last = outputs[1]
    # One output per key (the exact key -> count mapping is checked on the state below).
    assert sorted(last["n"]) == sorted(2 * (2 if v == values[0] else 1) for v in values)
    assert last["k"].nunique() == len(values)
    python_types = {"string": "str", "binary": "bytes", "boolean": "bool",
                    "decimal(10,2)": "Decimal", "date": "date", "timestamp": "Timestamp",
                    "timestamp_ntz": "Timestamp", "double": "float", "float": "float"}
    assert set(last["pytype"]) == {python_types.get(type_name, "int")}
    # The state is under the documented key bytes, in Spark's key group of them.
    keys = [encode_key((v,), (type_name,)) for v in values]
    counts = restored_counts(config, keys)
    assert counts == {k: 2 * (2 if k == keys[0] else 1) for k in keys}
    WorkerResources.release(config)


@pytest.mark.broker
def test_long_user_ids_and_composite_keys_through_the_reader(spark: Any,
                                                             kafka_cluster: Any) -> None:
    prefix = f"ckeys-{uuid.uuid4().hex[:8]}"
    config = app_config(kafka_cluster, prefix, parallelism=3)
    events = [("eu", 10**9 + i % 7, i) for i in range(60)] + [("us", 10**9, 60)]

    def per_region_user(key: Any, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
        count = state(COUNT)
        count.update((count.value() or 0) + len(rows))
        region, user = key
        return [{"region": region, "user": user, "n": count.value(),
                 "types": f"{type(key).__name__}({type(user).__name__})"}]

    outputs: list[pd.DataFrame] = []
    with stateful_foreach_batch(config, per_region_user, ["region", "user"],
                                "region string, user long, n long, types string",
                                sink=lambda frame, _: outputs.append(frame.toPandas()),
                                order_by=["seq"]) as proc:
        frame = spark.createDataFrame(events, "region string, user long, seq long")
        proc(frame, 0)
        proc(frame.where("seq < 30"), 1)
    assert set(outputs[0]["types"]) == {"tuple(int)"}
    assert sorted(zip(outputs[0]["region"], outputs[0]["user"], strict=True)) == sorted(
        {(r, u) for r, u, _ in events})
    expected: dict[tuple[str, int], int] = {}
    for region, user, seq in events:
        expected[(region, user)] = expected.get((region, user), 0) + (2 if seq < 30 else 1)
    from spark_integration import register

    register(spark)
    reader = (spark.read.format("kafka-changelog")
              .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
              .option("application", prefix).option("changelog.topic", config.changelog_topic)
              .option("snapshot.topic", config.snapshot_topic)
              .option("checkpoint.topic", config.checkpoint_topic))
    state = reader.option("mode", "state").load().where("state = 'count'").collect()
    by_key = {bytes(r["key"]): (r["key_group"], int(r["value_decoded"])) for r in state}
    assert by_key == {
        encode_key(k, ("string", "bigint")): (
            key_group_for_key(encode_key(k, ("string", "bigint")), 128), n)
        for k, n in expected.items()}
    # The recorded key types decode the keys: one column's text, several as a JSON array,
    # which Spark SQL takes apart again.
    decoded = reader.option("mode", "state").load().where("state = 'count'").selectExpr(
        "from_json(key_decoded, 'array<string>') AS parts", "cast(value_decoded AS long) AS n")
    assert {(r.parts[0], int(r.parts[1])): r.n for r in decoded.collect()} == expected
    changes = reader.option("mode", "changes").load().where("op != 'META'").collect()
    assert changes and all(
        r["key_decoded"] == json.dumps(list(decode_key(bytes(r["key"]), ("string", "bigint"))),
                                       separators=(",", ":")) for r in changes)
    WorkerResources.release(config)


@pytest.mark.broker
def test_a_null_key_fails_the_batch_naming_the_column(spark: Any, kafka_cluster: Any) -> None:
    prefix = f"nulls-{uuid.uuid4().hex[:8]}"
    config = app_config(kafka_cluster, prefix)
    with stateful_foreach_batch(config, count_rows, ["region", "user"],
                                "k string, n long, pytype string") as processor:
        processor(spark.createDataFrame([("eu", 1)], "region string, user long"), 0)
        bad = spark.createDataFrame([("eu", 1), ("eu", None), ("us", 2)],
                                    "region string, user long")
        with pytest.raises(Exception) as failure:
            processor(bad, 1)
        assert NullKeyError.__name__ in str(failure.value)
        assert "batch 1: 1 rows have a null in key column(s) ['user']" in str(failure.value)
        # Nothing of the failed batch was committed.
        coordinator = WorkerResources.coordinator(config)
        assert coordinator.checkpoints.checkpoint_ids(prefix) == [1]


@pytest.mark.broker
def test_a_dict_is_one_output_row_and_a_wrong_return_names_the_key(spark: Any,
                                                                    kafka_cluster: Any) -> None:
    prefix = f"returns-{uuid.uuid4().hex[:8]}"
    config = app_config(kafka_cluster, prefix)

    def one_row(key: Any, rows: pd.DataFrame, state: Any) -> Any:
        count = state(COUNT)
        count.update((count.value() or 0) + len(rows))
        if key == "oops":
            return "oops"  # a habit from elsewhere: one value instead of rows
        return {"k": key, "n": count.value(), "pytype": type(key).__name__}

    outputs: list[pd.DataFrame] = []
    with stateful_foreach_batch(config, one_row, "user", "k string, n long, pytype string",
                                sink=lambda frame, _: outputs.append(frame.toPandas())
                                ) as processor:
        processor(spark.createDataFrame([("a",), ("a",), ("b",)], "user string"), 0)
        assert sorted(zip(outputs[0]["k"], outputs[0]["n"], strict=True)) == [("a", 2), ("b", 1)]
        with pytest.raises(Exception) as failure:
            processor(spark.createDataFrame([("a",), ("oops",)], "user string"), 1)
        assert ("the stateful function returned str 'oops' for key 'oops': return the output "
                "rows as a pandas DataFrame, a dict (one row)") in str(failure.value)
        coordinator = WorkerResources.coordinator(config)
        assert coordinator.checkpoints.checkpoint_ids(prefix) == [1]  # nothing of batch 1


@pytest.mark.broker
def test_output_columns_are_checked_by_name_and_may_have_any_type(spark: Any,
                                                                   kafka_cluster: Any) -> None:
    prefix = f"columns-{uuid.uuid4().hex[:8]}"
    config = app_config(kafka_cluster, prefix)
    schema = "user string, amount decimal(10,2), tags array<string>, n long"

    def totals(key: Any, rows: pd.DataFrame, state: Any) -> Any:
        count = state(COUNT)
        count.update((count.value() or 0) + len(rows))
        row = {"user": key, "amount": Decimal("1.50") * len(rows), "tags": ["a", "b"],
               "n": count.value()}
        if key == "typo":
            row["amuont"] = row.pop("amount")
        return row

    outputs: list[pd.DataFrame] = []
    with stateful_foreach_batch(config, totals, "user", schema,
                                sink=lambda frame, _: outputs.append(frame.toPandas())
                                ) as processor:
        processor(spark.createDataFrame([("a",), ("a",), ("b",)], "user string"), 0)
        found = sorted((r.user, r.amount, list(r.tags), r.n) for r in outputs[0].itertuples())
        assert found == [("a", Decimal("3.00"), ["a", "b"], 2),
                         ("b", Decimal("1.50"), ["a", "b"], 1)]
        with pytest.raises(Exception) as failure:
            processor(spark.createDataFrame([("a",), ("typo",)], "user string"), 1)
        assert ("an output row for key 'typo' has columns ['amuont', 'n', 'tags', 'user'], but "
                "output_schema names ['amount', 'n', 'tags', 'user']: unknown ['amuont'], "
                "missing ['amount']") in str(failure.value)
        coordinator = WorkerResources.coordinator(config)
        assert coordinator.checkpoints.checkpoint_ids(prefix) == [1]
