"""The local Apache Kafka ``kafka-changelog broker`` runs: KRaft nodes as local JVMs.

:class:`~.broker.LocalKafkaCluster` starts one or three combined broker/controller
nodes on loopback ports from the Kafka jars (:mod:`.jars`, fetched from Maven Central
once by :mod:`.maven`, which also fetches Spark's Kafka connector), optionally with
SASL and ACLs (:mod:`.security`, :mod:`.acls`), and leaves nothing running behind it
(:mod:`.process`, :mod:`.workdir`). The test kit (:mod:`kafka_changelog.testing`) runs
its brokers with it.
"""
