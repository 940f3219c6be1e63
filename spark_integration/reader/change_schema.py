"""The Arrow schema of mode ``changes`` of ``format("kafka-changelog")``, and its constants.

Exactly what Spark derives from the reader's Spark schema (a test compares the two):
Spark refuses batches whose schema differs. No pyspark import.
"""

from __future__ import annotations

import pyarrow as pa

#: Rows per record batch (at most).
BATCH_ROWS = 10_000

#: ``op`` of a registration (meta change) row.
META_OP = "META"

#: Type of the ``values`` column.
BINARY_LIST = pa.list_(pa.field("element", pa.binary()))

#: Mode ``changes``: one row per change of the checkpoint's changelog handles.
CHANGES_SCHEMA = pa.schema([
    pa.field("operator", pa.string()),
    pa.field("subtask", pa.int32()),
    pa.field("log_id", pa.string()),
    pa.field("key_group", pa.int32()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("sequence_number", pa.int64()),
    pa.field("position", pa.int32()),
    pa.field("op", pa.string()),
    pa.field("state", pa.string()),
    pa.field("key", pa.binary()),
    pa.field("map_key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("values", BINARY_LIST),
    pa.field("key_decoded", pa.string()),
])

__all__ = ["BATCH_ROWS", "BINARY_LIST", "CHANGES_SCHEMA", "META_OP"]
