"""A state write killed mid-way (``test_state_writer``): a driver of its own writes ROWS
rows of state ``visits`` over two tasks; the second task stops after its first rows,
leaves a marker file and waits to be killed (with its driver, by the test), while the
first task's log is persisted already.

Run: ``python -m tests.spark.killed_state_write OPTIONS_JSON MARKER``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

ROWS = 4000


def stall_in_second_task(marker: str) -> object:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        for batch in batches:
            yield batch
            if context is not None and context.partitionId() == 1:
                Path(marker).write_text(str(os.getpid()))
                time.sleep(600)  # killed here

    return run


def main(options: dict[str, str], marker: str) -> None:
    from spark_integration import local_session, register

    spark = local_session(parallelism=2, extra_config={
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    register(spark)
    rows = spark.range(0, ROWS, 1, 2).selectExpr(
        "'visits' AS state", "CAST(concat('k', id) AS BINARY) AS key",
        "unhex(lpad(hex(id), 16, '0')) AS value")
    rows = rows.mapInArrow(stall_in_second_task(marker), rows.schema)
    rows.write.format("kafka-changelog").options(**options).mode("append").save()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
