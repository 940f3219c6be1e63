"""Read ``format("kafka-changelog")`` on a Spark cluster, in a driver of its own.

``python -m tests.spark.cluster_read MASTER OPTIONS_JSON SPARK_CONF_JSON OUT`` reads
once per options dict of the ``OPTIONS_JSON`` list, collects the rows (binary as
bytes, arrays as lists) and pickles ``{"reads": [rows, ...], "executors": N}`` to
``OUT`` (``N``: executors that served the session). A test process holds a
``local[2]`` session already; a JVM has one Spark context at a time, so the
cluster's driver runs here.
"""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any

from spark_integration import register
from spark_integration.sessions.session import spark_session


def plain(value: Any) -> Any:
    """Row values as the tests compare them."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def main(master: str, reads: list[dict[str, str]], config: dict[str, str], out: str) -> int:
    spark = spark_session(master, "cluster-read", 2, config)
    try:
        register(spark)
        rows = [[tuple(plain(v) for v in row) for row in
                 spark.read.format("kafka-changelog").options(**options).load().collect()]
                for options in reads]
        # Executors that registered with this driver (the driver's own entry excluded).
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    finally:
        spark.stop()
    with open(out, "wb") as sink:
        pickle.dump({"reads": rows, "executors": executors}, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]))
