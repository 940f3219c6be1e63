"""Sessions: reaching Spark and Kafka with the right Python, jars and security.

:mod:`.session` (a classic or Connect session whose workers run this interpreter, with
Spark's Kafka connector), :mod:`.connector` (the connector's jars, resolved once;
``python -m spark_integration.sessions.connector``), :mod:`.connect` (what the other
packages need of a Spark Connect session), :mod:`.connect_server` (a Connect server's
command line; ``python -m spark_integration.sessions.connect_server``) and
:mod:`.kafka_options` (the state's librdkafka security as Spark's Kafka options).

Below both the reader (:mod:`spark_integration.reader`) and streaming
(:mod:`spark_integration.streaming`), which may import it; it imports neither. Its
public names are exported by :mod:`spark_integration`. This file imports nothing: the
reader's worker-side modules import :mod:`.connect` without pyspark.
"""
