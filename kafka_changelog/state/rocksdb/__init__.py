"""The RocksDB working copy: a keyed state table in RocksDB and its parts (key layout,
mutations, change tracking, per-group writes, SST ingest, tuning options).

Imports only :mod:`~kafka_changelog.state.tables` and below.
"""
