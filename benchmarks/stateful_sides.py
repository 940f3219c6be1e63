"""The sides of ``bench_spark_stateful``: a registry of streaming queries on one workload.

Every side is a real Structured Streaming query over the same file source (see
:mod:`benchmarks.stateful_workload`) whose outputs reach the same sink function,
``sink(df, batch_id)``, which computes the batch's output checksum with one Spark
aggregate. A side is a :class:`Side` in :data:`SIDES` (add one with
:func:`register`):

- ``stateless``: the baseline: the same per-key work without state, laid out like
  ours (rows bucketed by our subtask, one Spark partition per bucket,
  ``mapInPandas``; per user in ``seq`` order the loop of
  :func:`benchmarks.bench_streaming_overhead.fold_user`), inside ``foreachBatch``;
  its outputs are each batch's own totals.
- ``ours_memory`` / ``ours_rocksdb``: ``stateful_foreach_batch(config,
  clickstream.update_user, "user", OUTPUT_SCHEMA, sink=..., order_by=["seq"])``
  as ``writeStream.foreachBatch(processor)``, with ``state_backend`` "memory" or
  "rocksdb".
- ``ours_rocksdb_thread``: ``ours_rocksdb`` with ``materialization_nice=None`` (background
  materializations on a thread of the Python worker instead of a process of their own);
- ``ours_vectorized`` / ``ours_vectorized_memory``: the vectorised entry point,
  ``stateful_foreach_batch(..., vectorized=True)`` with ``clickstream.update_users``
  (``fn(rows, state) -> DataFrame``: all of a subtask's rows of a batch, state read and
  written for many keys per call), state backend "rocksdb" / "memory".
- ``spark_apply_in_pandas_with_state``: ``groupBy("user").applyInPandasWithState``
  (``GroupStateTimeout.NoTimeout``, output mode update).
- ``spark_transform_with_state``: ``groupBy("user").transformWithStateInPandas`` with a
  ``StatefulProcessor`` holding two ``ValueState``, a ``MapState`` and a ``ListState``.

Spark's two operators read a user's state once, fold the user's rows of the batch on
local variables (the same loop as the baseline) and write the state once, which is
how their APIs are meant to be used (``transformWithStateInPandas`` state calls are
round trips to the JVM). Ours calls ``update_user``, which updates its state objects
per event.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from benchmarks.bench_streaming_overhead import BUCKET_COLUMN, BUCKET_EXPR
from benchmarks.bench_streaming_overhead import stateless_bucket as overhead_bucket
from benchmarks.stateful_registry import (
    BASELINE,
    BATCH_ONLY,
    CUMULATIVE,
    OURS,
    SPARK,
    RunContext,
    Side,
    protobuf_unavailable,
)
from benchmarks.stateful_registry import register as add_side
from benchmarks.stateful_workload import LAST_PAGES, UserState, sample_sql, user_state
from examples.clickstream import EVENTS, OUTPUT_SCHEMA, update_user, update_users
from spark_integration.streaming import KeyState, StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.vectorized import BatchState

#: applyInPandasWithState's state. PySpark 4.2.0 cannot give a Python worker a state
#: schema with array or map fields (its worker fails parsing the schema JSON: KeyError
#: 'elementType' / 'keyType'), so the count per kind and the last pages are JSON text.
APPLY_STATE_SCHEMA = "events long, spent double, kinds string, pages string"

#: The vectorised clickstream function (``fn(rows, state) -> DataFrame``).
VECTORIZED_FN = "examples.clickstream:update_users"

#: The registry, in the order sides run.
SIDES: dict[str, Side] = {}


def register(side: Side) -> Side:
    """Add ``side`` to :data:`SIDES` (names are unique)."""
    return add_side(SIDES, side)


# --- the per-key work -------------------------------------------------------------


def fold_rows(rows: pd.DataFrame, events: int, spent: float | None, kinds: dict[str, int],
              pages: list[str]) -> tuple[int, float | None, dict[str, int], list[str]]:
    """Fold one user's rows (``seq`` order) into its totals: ``update_user``'s loop on
    local variables (as :func:`fold_user`), returning the new totals."""
    for row in rows.itertuples(index=False):
        events += 1
        amount = float(row.amount)
        spent = amount if spent is None else round(spent + amount, 2)
        kinds[row.kind] = kinds.get(row.kind, 0) + 1
        pages.append(row.page)
    return events, spent, kinds, pages[-LAST_PAGES:]


def _sorted_rows(frames: Iterator[pd.DataFrame]) -> pd.DataFrame:
    parts = list(frames)
    rows = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    return rows.sort_values("seq", kind="stable")


# --- stateless baseline -----------------------------------------------------------


def stateless_bucket(batches: Iterator[pd.DataFrame], corrupt_user: str | None = None
                     ) -> Iterator[pd.DataFrame]:
    """One bucket (one subtask of ours): ``bench_streaming_overhead``'s baseline (sort by
    user and ``seq``, :func:`fold_user` per user), ``corrupt_user`` given one event too
    many."""
    for frame in overhead_bucket(batches):
        if corrupt_user is not None:
            frame.loc[frame["user"] == corrupt_user, "events"] += 1
        yield frame


def _start_stateless(ctx: RunContext) -> Any:
    from pyspark.sql import functions as F

    from spark_integration.streaming.subtask_partitioning import partition_by_subtask

    bucket = functools.partial(stateless_bucket, corrupt_user=ctx.corrupt_user)
    sink = ctx.sink

    def batch(df: Any, batch_id: int) -> None:
        bucketed = df.withColumn(BUCKET_COLUMN, F.expr(BUCKET_EXPR))
        out = partition_by_subtask(bucketed, BUCKET_COLUMN, 2).mapInPandas(
            bucket, OUTPUT_SCHEMA)
        sink(out, batch_id)

    return (ctx.source.writeStream.foreachBatch(batch)
            .option("checkpointLocation", ctx.checkpoint_dir).start())


register(Side("stateless", "stateless baseline (same per-key work, no state)", BASELINE,
              BATCH_ONLY, _start_stateless))


# --- ours -------------------------------------------------------------------------


def corrupted_update_user(corrupt_user: str, key: str, rows: pd.DataFrame, state: KeyState
                          ) -> list[dict[str, Any]]:
    """``update_user``, then one event too many in ``corrupt_user``'s count."""
    out = update_user(key, rows, state)
    if key == corrupt_user:
        count = state(EVENTS)
        count.update((count.value() or 0) + 1)
    return out


def corrupted_update_users(corrupt_user: str, rows: pd.DataFrame, state: BatchState
                           ) -> pd.DataFrame:
    """``update_users``, then one event too many in ``corrupt_user``'s count."""
    out = update_users(rows, state)
    if corrupt_user in state.keys:
        counts = state.value(EVENTS)
        (count,) = counts.get([corrupt_user], 0)
        counts.set([corrupt_user], [count + 1])
    return out


def _ours_config(ctx: RunContext, backend: str, **overrides: Any) -> StreamingStateConfig:
    if ctx.state_config is None:
        raise ValueError("our sides need a state_config (Kafka topics, application)")
    return StreamingStateConfig(**{**ctx.state_config, "state_backend": backend, **overrides})


def _start_ours(backend: str, vectorized: bool, ctx: RunContext, **overrides: Any) -> Any:
    config = _ours_config(ctx, backend, **overrides)
    if vectorized:
        fn: Any = (_vectorized_fn() if ctx.corrupt_user is None
                   else functools.partial(corrupted_update_users, ctx.corrupt_user))
        kwargs: dict[str, Any] = {"vectorized": True}
    else:
        fn = (update_user if ctx.corrupt_user is None
              else functools.partial(corrupted_update_user, ctx.corrupt_user))
        kwargs = {}
    processor = stateful_foreach_batch(config, fn, "user", OUTPUT_SCHEMA, sink=ctx.sink,
                                       order_by=["seq"], **kwargs)
    ctx.extras["processor"] = processor
    return (ctx.source.writeStream.foreachBatch(processor)
            .option("checkpointLocation", ctx.checkpoint_dir).start())


def ours_state_rows(ctx: RunContext, permille: int, states: Sequence[str] = ()
                    ) -> pd.DataFrame:
    """The sampled users' state rows at the latest checkpoint, through our Spark reader:
    ``user, state, map_key, list_index, value_decoded`` (of ``states`` only, if given)."""
    from spark_integration import register as register_reader

    config = ctx.state_config or {}
    register_reader(ctx.spark)
    reader = (ctx.spark.read.format("kafka-changelog").option("mode", "state")
              .option("application", config["application"])
              .option("operator", config["operator_id"])
              .option("changelog.topic", config["changelog_topic"])
              .option("snapshot.topic", config["snapshot_topic"])
              .option("checkpoint.topic", config["checkpoint_topic"])
              .option("kafka.bootstrap.servers", config["bootstrap_servers"]))
    for key, value in (config.get("client_config") or {}).items():
        reader = reader.option(f"kafka.{key}", str(value))
    rows: pd.DataFrame = (
        reader.load().where(sample_sql("cast(key AS string)", permille))
        .where(" OR ".join(f"state = '{name}'" for name in states) or "true")
        .selectExpr("cast(key AS string) AS user", "state",
                    "cast(map_key AS string) AS map_key", "list_index", "value_decoded")
        .toPandas())
    return rows


def _read_ours(ctx: RunContext, permille: int) -> dict[str, UserState]:
    """The sampled users' state at the latest checkpoint, through our Spark reader."""
    rows = ours_state_rows(ctx, permille)
    found: dict[str, dict[str, Any]] = {}
    for row in rows.sort_values(["user", "state", "list_index"], na_position="first") \
            .itertuples(index=False):
        s = found.setdefault(row.user, {"events": 0, "spent": None, "kinds": {}, "pages": []})
        if row.state == "events":
            s["events"] = int(row.value_decoded)
        elif row.state == "spent":
            s["spent"] = float(row.value_decoded)
        elif row.state == "kinds":
            s["kinds"][row.map_key] = int(row.value_decoded)
        elif row.state == "last_pages":
            s["pages"].append(row.value_decoded)
    return {u: user_state(s["events"], s["spent"], s["kinds"], s["pages"])
            for u, s in found.items()}


def _vectorized_fn() -> Any:
    module, _, name = VECTORIZED_FN.partition(":")
    return getattr(importlib.import_module(module), name)


def _vectorized_unavailable() -> str | None:
    """Why ``ours_vectorized`` cannot run yet (None once the API and function exist)."""
    if "vectorized" not in inspect.signature(stateful_foreach_batch).parameters:
        return "not available: stateful_foreach_batch has no `vectorized` parameter yet"
    try:
        _vectorized_fn()
    except (ImportError, AttributeError):
        return f"not available: no vectorised clickstream function {VECTORIZED_FN}"
    return None


register(Side("ours_memory", "ours, state_backend=memory", OURS, CUMULATIVE,
              functools.partial(_start_ours, "memory", False), _read_ours))
register(Side("ours_rocksdb", "ours, state_backend=rocksdb", OURS, CUMULATIVE,
              functools.partial(_start_ours, "rocksdb", False), _read_ours))
register(Side("ours_rocksdb_thread",
              "ours, state_backend=rocksdb, materializations on a worker thread", OURS,
              CUMULATIVE, functools.partial(_start_ours, "rocksdb", False,
                                            materialization_nice=None), _read_ours))
register(Side("ours_vectorized", "ours, vectorized=True (rocksdb)", OURS, CUMULATIVE,
              functools.partial(_start_ours, "rocksdb", True), _read_ours,
              _vectorized_unavailable))
register(Side("ours_vectorized_memory", "ours, vectorized=True (memory)", OURS, CUMULATIVE,
              functools.partial(_start_ours, "memory", True), _read_ours,
              _vectorized_unavailable))


# --- Spark's applyInPandasWithState -----------------------------------------------


def apply_in_pandas_state(corrupt_user: str | None, key: tuple[Any, ...],
                          frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """One user's rows of the batch into its ``GroupState`` (:data:`APPLY_STATE_SCHEMA`)."""
    (user,) = key
    if state.exists:
        events, spent, kinds_json, pages_json = state.get
        kinds, pages = json.loads(kinds_json), json.loads(pages_json)
    else:
        events, spent, kinds, pages = 0, None, {}, []
    events, spent, kinds, pages = fold_rows(_sorted_rows(frames), events, spent, kinds, pages)
    if user == corrupt_user:
        events += 1
    state.update((events, spent, json.dumps(kinds), json.dumps(pages)))
    yield pd.DataFrame({"user": [user], "events": [events], "spent": [spent]})


def _start_apply(ctx: RunContext) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout

    out = ctx.source.groupBy("user").applyInPandasWithState(
        functools.partial(apply_in_pandas_state, ctx.corrupt_user), OUTPUT_SCHEMA,
        APPLY_STATE_SCHEMA, "update", GroupStateTimeout.NoTimeout)
    return (out.writeStream.outputMode("update").foreachBatch(ctx.sink)
            .option("checkpointLocation", ctx.checkpoint_dir).start())


def _read_apply(ctx: RunContext, permille: int) -> dict[str, UserState]:
    rows = (ctx.spark.read.format("statestore").load(ctx.checkpoint_dir)
            .where(sample_sql("key.user", permille))
            .selectExpr("key.user AS user", "value.groupState.*").toPandas())
    return {r.user: user_state(r.events, r.spent, json.loads(r.kinds), json.loads(r.pages))
            for r in rows.itertuples(index=False)}


register(Side("spark_apply_in_pandas_with_state", "Spark applyInPandasWithState", SPARK,
              CUMULATIVE, _start_apply, _read_apply))


# --- Spark's transformWithStateInPandas -------------------------------------------


class ClickstreamProcessor(StatefulProcessor):
    """Per user: events and spent (``ValueState``), count per kind (``MapState``), last
    pages (``ListState``); one output row per user per batch."""

    def __init__(self, corrupt_user: str | None = None) -> None:
        self.corrupt_user = corrupt_user

    def init(self, handle: Any) -> None:
        self.events = handle.getValueState("events", "value long")
        self.spent = handle.getValueState("spent", "value double")
        self.kinds = handle.getMapState("kinds", "kind string", "count long")
        self.pages = handle.getListState("last_pages", "page string")

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        (user,) = key
        got = self.events.get()
        events = got[0] if got is not None else 0
        got = self.spent.get()
        spent = got[0] if got is not None else None
        pages = [row[0] for row in self.pages.get()]
        local: dict[str, int] = {}
        events, spent, local, pages = fold_rows(_sorted_rows(rows), events, spent, local, pages)
        if user == self.corrupt_user:
            events += 1
        for kind, count in local.items():
            old = self.kinds.getValue((kind,))
            self.kinds.updateValue((kind,), (count + (old[0] if old is not None else 0),))
        self.events.update((events,))
        self.spent.update((spent,))
        self.pages.put([(page,) for page in pages])
        yield pd.DataFrame({"user": [user], "events": [events], "spent": [spent]})

    def close(self) -> None:
        pass


def _start_transform(ctx: RunContext) -> Any:
    processor = ClickstreamProcessor(ctx.corrupt_user)
    out = ctx.source.groupBy("user").transformWithStateInPandas(
        processor, OUTPUT_SCHEMA, "Update", "None")
    return (out.writeStream.outputMode("update").foreachBatch(ctx.sink)
            .option("checkpointLocation", ctx.checkpoint_dir).start())


def _read_transform(ctx: RunContext, permille: int) -> dict[str, UserState]:
    def read(var: str, flatten: bool = True) -> pd.DataFrame:
        return (ctx.spark.read.format("statestore").option("stateVarName", var)
                .option("flattenCollectionTypes", str(flatten).lower())
                .load(ctx.checkpoint_dir).where(sample_sql("key.user", permille)))

    events = read("events").selectExpr("key.user AS user", "value.value AS v").toPandas()
    spent = read("spent").selectExpr("key.user AS user", "value.value AS v").toPandas()
    kinds = read("kinds").selectExpr("key.user AS user", "user_map_key.kind AS kind",
                                     "user_map_value.count AS count").toPandas()
    pages = read("last_pages", flatten=False).selectExpr(
        "key.user AS user", "transform(list_value, p -> p.page) AS pages").toPandas()
    spent_of = dict(zip(spent["user"], spent["v"], strict=True))
    kinds_of: dict[str, dict[str, int]] = {}
    for row in kinds.itertuples(index=False):
        kinds_of.setdefault(row.user, {})[row.kind] = int(row.count)
    pages_of = {row.user: list(row.pages) for row in pages.itertuples(index=False)}
    return {u: user_state(int(e), spent_of.get(u), kinds_of.get(u, {}), pages_of.get(u, []))
            for u, e in zip(events["user"], events["v"], strict=True)}


register(Side("spark_transform_with_state", "Spark transformWithStateInPandas", SPARK,
              CUMULATIVE, _start_transform, _read_transform, protobuf_unavailable))
