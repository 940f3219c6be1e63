"""Write state with ``format("kafka-changelog")`` from a Spark Connect client, in a process of
its own (a Connect client switches PySpark's whole process to Connect mode).

``python -m tests.spark.connect_write URL OPTIONS_JSON ROWS_JSON`` registers the format on
the server through the client and applies the rows (``state``, ``key`` as text,
``value_decoded``) with ``mode("append")``.
"""

from __future__ import annotations

import json
import sys

from spark_integration import register
from spark_integration.sessions.connect import is_connect
from spark_integration.sessions.session import spark_session


def main(url: str, options: dict[str, str], rows: list[list[str]]) -> int:
    spark = spark_session(url, "connect-write", 2)
    try:
        assert is_connect(spark), type(spark)
        register(spark)
        frame = spark.createDataFrame(rows, "state string, key string, value_decoded string")
        frame.selectExpr("state", "CAST(key AS BINARY) AS key", "value_decoded").write.format(
            "kafka-changelog").options(**options).mode("append").save()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])))
