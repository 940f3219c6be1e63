"""Module paths from before the library's packages were regrouped by role (issue #39):
importing one gives the module where it lives now, with a ``DeprecationWarning``.

The guides and examples named some of these paths (``kafka_changelog.state.descriptors``,
``spark_integration.kafka_sink``, ...), so programs import from them; the public names are
re-exported from ``kafka_changelog.state``, ``spark_integration`` and
``spark_integration.streaming``, where the guides import them now. An alias is the module
itself, not a copy: classes, ``isinstance`` and pickles are the same through either path.
The aliases go with the next minor version.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

#: Old module path -> the module's path now.
MOVED_MODULES: dict[str, str] = {
    "kafka_changelog.state.acquire": "kafka_changelog.state.host.acquire",
    "kafka_changelog.state.avro_names": "kafka_changelog.state.schema.avro_names",
    "kafka_changelog.state.avro_resolution": "kafka_changelog.state.schema.avro_resolution",
    "kafka_changelog.state.backend_config": "kafka_changelog.state.backend.config",
    "kafka_changelog.state.bulk_state": "kafka_changelog.state.backend.bulk_state",
    "kafka_changelog.state.bulk_ttl": "kafka_changelog.state.backend.bulk_ttl",
    "kafka_changelog.state.checkpoint": "kafka_changelog.state.checkpoints.checkpoint",
    "kafka_changelog.state.checkpoint_store": "kafka_changelog.state.checkpoints.checkpoint_store",
    "kafka_changelog.state.chunk_sweep": "kafka_changelog.state.snapshots.chunk_sweep",
    "kafka_changelog.state.coordinator": "kafka_changelog.state.history.coordinator",
    "kafka_changelog.state.delta_layer": "kafka_changelog.state.snapshots.delta_layer",
    "kafka_changelog.state.descriptors": "kafka_changelog.state.schema.descriptors",
    "kafka_changelog.state.driver_claim": "kafka_changelog.state.checkpoints.driver_claim",
    "kafka_changelog.state.fork": "kafka_changelog.state.history.fork",
    "kafka_changelog.state.host_store": "kafka_changelog.state.host.host_store",
    "kafka_changelog.state.input_forget": "kafka_changelog.state.history.input_forget",
    "kafka_changelog.state.input_progress": "kafka_changelog.state.checkpoints.input_progress",
    "kafka_changelog.state.key_buffer": "kafka_changelog.state.tables.key_buffer",
    "kafka_changelog.state.keyed_backend": "kafka_changelog.state.backend.keyed_backend",
    "kafka_changelog.state.key_group_codec": "kafka_changelog.state.schema.key_group_codec",
    "kafka_changelog.state.kinds": "kafka_changelog.state.schema.kinds",
    "kafka_changelog.state.local_cleanup": "kafka_changelog.state.host.local_cleanup",
    "kafka_changelog.state.local_recovery": "kafka_changelog.state.backend.local_recovery",
    "kafka_changelog.state.local_store": "kafka_changelog.state.host.local_store",
    "kafka_changelog.state.materialization": "kafka_changelog.state.snapshots.materialization",
    "kafka_changelog.state.materializer": "kafka_changelog.state.snapshots.materializer",
    "kafka_changelog.state.operator_state": "kafka_changelog.state.backend.operator_state",
    "kafka_changelog.state.ops": "kafka_changelog.state.schema.ops",
    "kafka_changelog.state.restore": "kafka_changelog.state.backend.restore",
    "kafka_changelog.state.rewind": "kafka_changelog.state.history.rewind",
    "kafka_changelog.state.rocksdb_changes": "kafka_changelog.state.rocksdb.changes",
    "kafka_changelog.state.rocksdb_group_writes": "kafka_changelog.state.rocksdb.group_writes",
    "kafka_changelog.state.rocksdb_ingest": "kafka_changelog.state.rocksdb.ingest",
    "kafka_changelog.state.rocksdb_keys": "kafka_changelog.state.rocksdb.keys",
    "kafka_changelog.state.rocksdb_mutation": "kafka_changelog.state.rocksdb.mutation",
    "kafka_changelog.state.rocksdb_options": "kafka_changelog.state.rocksdb.options",
    "kafka_changelog.state.rocksdb_table": "kafka_changelog.state.rocksdb.table",
    "kafka_changelog.state.schema_evolution": "kafka_changelog.state.schema.evolution",
    "kafka_changelog.state.serializers": "kafka_changelog.state.schema.serializers",
    "kafka_changelog.state.snapshot": "kafka_changelog.state.snapshots.snapshot",
    "kafka_changelog.state.snapshot_store": "kafka_changelog.state.snapshots.snapshot_store",
    "kafka_changelog.state.source_offsets": "kafka_changelog.state.checkpoints.source_offsets",
    "kafka_changelog.state.state_objects": "kafka_changelog.state.tables.state_objects",
    "kafka_changelog.state.store_materialization":
        "kafka_changelog.state.host.store_materialization",
    "kafka_changelog.state.subtask_backend": "kafka_changelog.state.host.subtask_backend",
    "kafka_changelog.state.subtask_commit": "kafka_changelog.state.checkpoints.subtask_commit",
    "kafka_changelog.state.table": "kafka_changelog.state.tables.memory",
    "kafka_changelog.state.table_protocol": "kafka_changelog.state.tables.protocol",
    "kafka_changelog.state.time_properties": "kafka_changelog.state.checkpoints.time_properties",
    "kafka_changelog.state.timers": "kafka_changelog.state.time.timers",
    "kafka_changelog.state.ttl": "kafka_changelog.state.schema.ttl",
    "kafka_changelog.state.ttl_state": "kafka_changelog.state.time.ttl_state",
    "spark_integration.batch_identity": "spark_integration.streaming.batch_identity",
    "spark_integration.change_arrow": "spark_integration.reader.change_arrow",
    "spark_integration.change_columns": "spark_integration.reader.change_columns",
    "spark_integration.change_schema": "spark_integration.reader.change_schema",
    "spark_integration.checkpoint_changes": "spark_integration.reader.checkpoint_changes",
    "spark_integration.connect": "spark_integration.sessions.connect",
    "spark_integration.connect_server": "spark_integration.sessions.connect_server",
    "spark_integration.connector": "spark_integration.sessions.connector",
    "spark_integration.datasource": "spark_integration.reader.datasource",
    "spark_integration.feed_planning": "spark_integration.reader.feed_planning",
    "spark_integration.feed_reading": "spark_integration.reader.feed_reading",
    "spark_integration.feed_schema": "spark_integration.reader.feed_schema",
    "spark_integration.feed_source": "spark_integration.reader.feed_source",
    "spark_integration.kafka_options": "spark_integration.sessions.kafka_options",
    "spark_integration.kafka_sink": "spark_integration.streaming.kafka_sink",
    "spark_integration.key_rows": "spark_integration.streaming.key_rows",
    "spark_integration.key_runs": "spark_integration.streaming.key_runs",
    "spark_integration.metrics": "spark_integration.streaming.metrics",
    "spark_integration.op_columns": "kafka_changelog.state.schema.op_columns",
    "spark_integration.output_rows": "spark_integration.streaming.output_rows",
    "spark_integration.packing": "spark_integration.reader.packing",
    "spark_integration.planning": "spark_integration.reader.planning",
    "spark_integration.pushdown": "spark_integration.reader.pushdown",
    "spark_integration.rewind_offsets": "spark_integration.streaming.rewind_offsets",
    "spark_integration.rows": "spark_integration.reader.rows",
    "spark_integration.scan": "spark_integration.reader.scan",
    "spark_integration.selected_plan": "spark_integration.reader.selected_plan",
    "spark_integration.session": "spark_integration.sessions.session",
    "spark_integration.streaming_config": "spark_integration.streaming.config",
    "spark_integration.subtask_hosts": "spark_integration.streaming.subtask_hosts",
    "spark_integration.subtask_partitioning": "spark_integration.streaming.subtask_partitioning",
    "spark_integration.task_reading": "spark_integration.reader.task_reading",
    "spark_integration.timer_rows": "spark_integration.reader.timer_rows",
    "spark_integration.worker_gc": "spark_integration.reader.worker_gc",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the module at its new path (imported if need be)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"module {spec.name} moved to {self.target}: import from there (or "
                      "from the package's public names)", DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran at its new path."""


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED_MODULES` (after every other finder)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        moved_to = MOVED_MODULES.get(fullname)
        if moved_to is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(moved_to))


def install() -> None:
    """Make the old paths importable (once per process)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())


__all__ = ["MOVED_MODULES", "install"]
