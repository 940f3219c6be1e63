"""The test kit for code built on kafka-changelog.

:mod:`.contract` is the contract suite every changelog storage must pass
(:class:`~.contract.ChangelogStorageContract`); :mod:`.pytest_plugin` is the opt-in
pytest plugin whose fixtures start real Kafka brokers: the local Kafka
(:mod:`kafka_changelog.local_kafka`), the ``apache/kafka`` image (:mod:`.container`) or
a cluster named in the environment (:mod:`.external`), each a :class:`~.cluster.KafkaCluster`.
"""
