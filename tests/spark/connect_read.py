"""Read ``format("kafka-changelog")`` from a Spark Connect client, in a process of its own.

``python -m tests.spark.connect_read URL OPTIONS_JSON OUT`` reads once per options dict
of the ``OPTIONS_JSON`` list through the Connect server at ``URL`` and pickles the rows
of each read (binary as bytes, arrays as lists) to ``OUT``. A Connect client switches
PySpark's whole process to Connect mode: the test process, whose session is classic,
reads here.
"""

from __future__ import annotations

import json
import pickle
import sys

from spark_integration import register
from spark_integration.sessions.connect import is_connect
from spark_integration.sessions.session import spark_session
from tests.spark.cluster_read import plain


def main(url: str, reads: list[dict[str, str]], out: str) -> int:
    spark = spark_session(url, "connect-read", 2)
    try:
        assert is_connect(spark), type(spark)
        register(spark)
        rows = [[tuple(plain(v) for v in row) for row in
                 spark.read.format("kafka-changelog").options(**options).load().collect()]
                for options in reads]
    finally:
        spark.stop()
    with open(out, "wb") as sink:
        pickle.dump(rows, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]))
