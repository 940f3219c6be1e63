"""A state write killed mid-way (``test_state_writer``): a driver of its own writes ROWS
rows of state ``visits`` over two tasks (``append``: applied, ``overwrite``: replacing);
the second task stops after its first rows, waits until the first task has handed over
all of its rows and a moment more (its log persisted, or its snapshot layers written),
leaves a marker file and waits to be killed (with its driver, by the test).

Run: ``python -m tests.spark.killed_state_write OPTIONS_JSON MARKER MODE``.
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


#: After the first task's rows, what it does with them takes this long at most.
FIRST_TASK_WRITES_S = 3.0


def stall_in_second_task(marker: str) -> object:
    first_done = Path(f"{marker}.first")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        for batch in batches:
            yield batch
            if task == 1:
                deadline = time.monotonic() + 120
                while not first_done.exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(FIRST_TASK_WRITES_S)
                Path(marker).write_text(str(os.getpid()))
                time.sleep(600)  # killed here
        if task == 0:
            first_done.write_text("")

    return run


def main(options: dict[str, str], marker: str, mode: str) -> None:
    from spark_integration import local_session, register

    spark = local_session(parallelism=2, extra_config={
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    register(spark)
    rows = spark.range(0, ROWS, 1, 2).selectExpr(
        "'visits' AS state", "CAST(concat('k', id) AS BINARY) AS key",
        "unhex(lpad(hex(id), 16, '0')) AS value")
    rows = rows.mapInArrow(stall_in_second_task(marker), rows.schema)
    rows.write.format("kafka-changelog").options(**options).mode(mode).save()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3])
