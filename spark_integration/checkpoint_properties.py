"""The checkpoint properties a Spark batch records: the query and the batch that committed it.

Streaming writes them with every checkpoint it commits
(:mod:`spark_integration.streaming.batch_identity` tells a new batch from a re-run by them);
the reader's change feed reads them back (every row's ``batch_id``,
:mod:`spark_integration.reader.feed_schema`). Both sides hold this contract, so it lives
at the top of the package, beside :mod:`spark_integration.keys`, and imports nothing.
"""

#: The id Spark keeps in the query's ``checkpointLocation``.
QUERY_ID = "spark.query_id"
#: The Spark batch id.
BATCH_ID = "spark.batch_id"

__all__ = ["BATCH_ID", "QUERY_ID"]
