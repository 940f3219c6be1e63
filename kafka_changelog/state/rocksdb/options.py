"""How the RocksDB state table tunes RocksDB: :class:`RocksDBOptions`.

Set it through :class:`~kafka_changelog.state.backend.config.StateBackendConfig`
(``rocksdb_options``) or, in streaming, through
:class:`~spark_integration.streaming.StreamingStateConfig` (``rocksdb_options``);
the defaults suit a Python worker holding a few subtask stores. The options are plain
data (picklable, hashable): they travel to Spark executors with the configs, and
``rocksdict`` is only imported when a table opens with them.

Whatever the options, writes skip RocksDB's write-ahead log: the Kafka changelog is the
durable log, and a store is only trusted again after a flush (see
:class:`~kafka_changelog.state.rocksdb.table.RocksDBStateTable`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

#: The compression types RocksDB offers (``rocksdict.DBCompressionType``).
COMPRESSIONS = ("none", "snappy", "zlib", "bz2", "lz4", "lz4hc", "zstd")

# Options built for each RocksDBOptions with share_block_cache: the tables of a process
# with equal options share one block cache (and so bound their cache memory together).
_shared: dict[RocksDBOptions, tuple[Any, Any]] = {}
_shared_lock = threading.Lock()


@dataclass(frozen=True)
class RocksDBOptions:
    """RocksDB settings of the RocksDB state table (frozen; checked when made).

    Memory per process is about ``block_cache_bytes`` (once if shared) plus, per open
    store, up to ``write_buffer_bytes * max_write_buffer_number`` of memtables.
    """

    #: Size of the LRU cache of uncompressed data blocks that point reads and scans go
    #: through (default 64 MiB).
    block_cache_bytes: int = 64 << 20
    #: True (the default): every table of the process opened with equal options uses
    #: one block cache, so a worker holding many stores keeps one cache's memory. False:
    #: each table has a cache of its own.
    share_block_cache: bool = True
    #: Size of a store's memtable before it is written to a file (default 32 MiB).
    write_buffer_bytes: int = 32 << 20
    #: Memtables a store keeps at most, the one written to and those being flushed
    #: (default 2).
    max_write_buffer_number: int = 2
    #: Bits per key of the bloom filters of the files (default 10, about 1% false
    #: positives), which let most point reads of absent keys skip a file; 0: none.
    bloom_filter_bits_per_key: int = 10
    #: Compression of the files (default "lz4"): one of :data:`COMPRESSIONS`.
    compression: str = "lz4"
    #: RocksDB info log files kept per store (default 1).
    keep_log_file_num: int = 1

    def __post_init__(self) -> None:
        for name in ("block_cache_bytes", "write_buffer_bytes", "max_write_buffer_number",
                     "keep_log_file_num"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("bloom_filter_bits_per_key", self.bloom_filter_bits_per_key, minimum=0)
        if not isinstance(self.share_block_cache, bool):
            raise ValueError(f"RocksDBOptions.share_block_cache must be a bool, got "
                             f"{self.share_block_cache!r}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"RocksDBOptions.compression must be one of "
                             f"{', '.join(COMPRESSIONS)}; got {self.compression!r}")

    def open_options(self, rocks: Any) -> tuple[Any, Any]:
        """``rocksdict`` options and write options for opening a store (``rocks`` is the
        ``rocksdict`` module): built once per process and options when the block cache is
        shared, else anew (with a cache of its own) each time."""
        if not self.share_block_cache:
            return self._build(rocks)
        with _shared_lock:
            built = _shared.get(self)
            if built is None:
                built = _shared[self] = self._build(rocks)
            return built

    def _build(self, rocks: Any) -> tuple[Any, Any]:
        table = rocks.BlockBasedOptions()
        table.set_block_cache(rocks.Cache(self.block_cache_bytes))
        if self.bloom_filter_bits_per_key:
            table.set_bloom_filter(self.bloom_filter_bits_per_key, False)
        options = rocks.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(self.write_buffer_bytes)
        options.set_max_write_buffer_number(self.max_write_buffer_number)
        options.set_block_based_table_factory(table)
        options.set_compression_type(getattr(rocks.DBCompressionType, self.compression)())
        options.set_keep_log_file_num(self.keep_log_file_num)
        write = rocks.WriteOptions()
        write.disable_wal = True  # the changelog is the durable log
        return options, write


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"RocksDBOptions.{name} must be an int >= {minimum}, got {value!r}")


__all__ = ["COMPRESSIONS", "RocksDBOptions"]
