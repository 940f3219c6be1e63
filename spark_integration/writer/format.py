"""``format("kafka-changelog")`` that reads and writes: the reader's data source with the
state writer (``df.write``) added, and :func:`register`, which registers it."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSourceWriter
from pyspark.sql.types import StructType

from ..reader.datasource import KafkaChangelogDataSource, register_source


class KafkaChangelogFormat(KafkaChangelogDataSource):
    """The ``kafka-changelog`` data source: its reads (the base class), and state writes
    (``mode("append")``, :mod:`.state_writer`)."""

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The state write of the DataFrame's rows to the application's latest checkpoint."""
        from .state_writer import state_writer  # planning a read never needs it

        return state_writer(dict(self.options), list(schema.names), overwrite)


def register(spark: Any) -> None:
    """Register ``format("kafka-changelog")`` with ``spark``, for reads and state writes
    (see :func:`spark_integration.reader.datasource.register_source`); idempotent."""
    register_source(spark, KafkaChangelogFormat)


__all__ = ["KafkaChangelogFormat", "register"]
