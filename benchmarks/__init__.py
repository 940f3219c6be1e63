"""Benchmarks of the Kafka changelog against a raw confluent-kafka producer (see README.md)."""
