"""Real Apache Kafka for tests and demos: local KRaft processes from Maven Central jars."""
