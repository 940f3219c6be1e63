"""RocksDB's settings (RocksDBOptions) and the backend kinds: set through either config,
they reach RocksDB; bad values are refused with errors naming the setting."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog import InMemoryChangelogStorage
from kafka_changelog.state import BackendKind, RocksDBOptions, StateBackendConfig
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore
from kafka_changelog.state.tables.memory import StateTable
from spark_integration.streaming.config import StreamingStateConfig

SMALL = RocksDBOptions(block_cache_bytes=8 << 20, share_block_cache=False,
                       write_buffer_bytes=4 << 20, compression="zstd")


def rocksdb_settings(table: RocksDBStateTable) -> dict[str, Any]:
    """What the open store reports of its settings: the block cache's capacity, and the
    write buffer size and compression from the OPTIONS file RocksDB writes."""
    options_file = sorted(table.path.glob("OPTIONS-*"))[-1]
    lines = dict(line.strip().split("=", 1) for line in options_file.read_text().splitlines()
                 if line.strip().startswith(("write_buffer_size=", "compression=")))
    return {"block_cache": table._db.property_int_value("rocksdb.block-cache-capacity"),
            "write_buffer_size": int(lines["write_buffer_size"]),
            "compression": lines["compression"]}


def test_the_defaults_are_the_documented_ones_and_the_options_travel() -> None:
    options = RocksDBOptions()
    assert (options.block_cache_bytes, options.share_block_cache, options.write_buffer_bytes,
            options.max_write_buffer_number, options.bloom_filter_bits_per_key,
            options.compression, options.keep_log_file_num) == (
        64 << 20, True, 32 << 20, 2, 10, "lz4", 1)
    assert pickle.loads(pickle.dumps(SMALL)) == SMALL  # to Spark executors
    assert hash(SMALL) == hash(dataclasses.replace(SMALL))
    with pytest.raises(dataclasses.FrozenInstanceError):
        SMALL.block_cache_bytes = 1  # type: ignore[misc]


@pytest.mark.parametrize(("change", "message"), [
    ({"block_cache_bytes": 0}, "block_cache_bytes must be an int >= 1, got 0"),
    ({"write_buffer_bytes": -1}, "write_buffer_bytes must be an int >= 1"),
    ({"max_write_buffer_number": 1.5}, "max_write_buffer_number must be an int"),
    ({"keep_log_file_num": True}, "keep_log_file_num must be an int"),
    ({"bloom_filter_bits_per_key": -1}, "bloom_filter_bits_per_key must be an int >= 0"),
    ({"compression": "gzip"}, "compression must be one of none, snappy, zlib, bz2, lz4, "
                              "lz4hc, zstd; got 'gzip'"),
    ({"share_block_cache": "yes"}, "share_block_cache must be a bool"),
])
def test_bad_values_are_refused_naming_the_setting(change: dict[str, Any],
                                                   message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        RocksDBOptions(**change)


def test_options_set_on_the_backend_config_reach_rocksdb(tmp_path: Path) -> None:
    table = StateBackendConfig("rocksdb", str(tmp_path), SMALL).create_table("op")
    assert isinstance(table, RocksDBStateTable)
    try:
        assert table.options == SMALL
        assert rocksdb_settings(table) == {"block_cache": 8 << 20,
                                           "write_buffer_size": 4 << 20,
                                           "compression": "kZSTD"}
    finally:
        table.close()
    default = StateBackendConfig(BackendKind.ROCKSDB, str(tmp_path)).create_table()
    assert isinstance(default, RocksDBStateTable)
    try:
        assert rocksdb_settings(default) == {"block_cache": 64 << 20,
                                             "write_buffer_size": 32 << 20,
                                             "compression": "kLZ4Compression"}
    finally:
        default.close()


def test_a_shared_block_cache_is_one_cache_for_equal_options(tmp_path: Path) -> None:
    shared = RocksDBOptions(block_cache_bytes=16 << 20)
    tables = [RocksDBStateTable(tmp_path / name, options=options) for name, options in
              (("a", shared), ("b", dataclasses.replace(shared)), ("own", SMALL))]
    try:
        a, b, own = (table._db for table in tables)
        a.put(b"k", b"v" * 1000)
        a.flush(True)
        assert a.get(b"k") is not None  # read through the block cache
        usage = a.property_int_value("rocksdb.block-cache-usage")
        assert usage > 0
        assert b.property_int_value("rocksdb.block-cache-usage") == usage
        assert own.property_int_value("rocksdb.block-cache-usage") < usage
    finally:
        for table in tables:
            table.close()


def test_options_set_on_the_streaming_config_reach_the_subtask_store(tmp_path: Path) -> None:
    from kafka_changelog.state.host.acquire import acquire, discard
    from spark_integration.streaming.task import host_store_settings, placement_of

    config = StreamingStateConfig(application="app", operator_id="op",
                                  bootstrap_servers="unused:9092", parallelism=1,
                                  local_state_dir=str(tmp_path), rocksdb_options=SMALL)
    assert pickle.loads(pickle.dumps(config)).rocksdb_options == SMALL
    with InMemoryChangelogStorage() as storage:
        acquired = acquire(placement_of(config, 0), None, [], None, storage,
                           InMemorySnapshotStore(), MaterializationConfig(interval_s=None),
                           host_store_settings(config))
        try:
            table = acquired.backend.table
            assert isinstance(table, RocksDBStateTable) and table.options == SMALL
            assert rocksdb_settings(table)["block_cache"] == 8 << 20
        finally:
            discard(acquired)


def test_backend_kinds_are_strings_and_the_configs_take_either() -> None:
    assert BackendKind.ROCKSDB == "rocksdb" and str(BackendKind.MEMORY) == "memory"
    assert StateBackendConfig("rocksdb").kind is BackendKind.ROCKSDB
    assert isinstance(StateBackendConfig().create_table(), StateTable)
    config = StreamingStateConfig(application="a", operator_id="op", bootstrap_servers="x",
                                  state_backend="memory")
    assert config.state_backend is BackendKind.MEMORY
    assert StreamingStateConfig(application="a", operator_id="op",
                                bootstrap_servers="x").state_backend is BackendKind.ROCKSDB
    assert dataclasses.replace(config, state_backend="rocksdb").state_backend \
        is BackendKind.ROCKSDB
    with pytest.raises(ValueError, match="state backend kind must be one of 'memory', "
                                         "'rocksdb', got 'heap'"):
        StateBackendConfig("heap")
    with pytest.raises(ValueError, match="state_backend must be one of 'memory', "
                                         "'rocksdb', got 'disk'"):
        StreamingStateConfig(application="a", operator_id="op", bootstrap_servers="x",
                             state_backend="disk")


def test_options_of_another_type_are_refused(tmp_path: Path) -> None:
    bad: Any = {"block_cache_bytes": 1 << 20}
    with pytest.raises(TypeError, match="rocksdb_options must be RocksDBOptions, got dict"):
        StateBackendConfig("rocksdb", rocksdb_options=bad)
    with pytest.raises(TypeError, match="rocksdb_options must be RocksDBOptions, got dict"):
        StreamingStateConfig(application="a", operator_id="op", bootstrap_servers="x",
                             rocksdb_options=bad)
    with pytest.raises(TypeError, match="options must be RocksDBOptions, got dict"):
        RocksDBStateTable(tmp_path / "db", options=bad)
