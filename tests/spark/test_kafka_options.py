"""Security given once: librdkafka settings translated for Spark's Kafka connector (the
Java client) and passed to the ``kafka-changelog`` reader as they are."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_integration.sessions.kafka_options import KafkaOptionsError, java_kafka_options
from spark_integration.streaming import StreamingStateConfig

SERVERS = "broker-1:9093,broker-2:9093"


def test_sasl_ssl_with_scram_becomes_a_jaas_line_and_a_pem_trust_store(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    options = java_kafka_options(SERVERS, {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "app", "sasl.password": 'p"w\\d', "ssl.ca.location": str(ca),
        "linger.ms": 5, "client.id": "mine"})
    assert options == {
        "kafka.bootstrap.servers": SERVERS,
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": ('org.apache.kafka.common.security.scram.ScramLoginModule '
                                   'required username="app" password="p\\"w\\\\d";'),
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.certificates": ca.read_text(),
        "kafka.ssl.endpoint.identification.algorithm": "https",
    }


def test_a_client_certificate_goes_inline_so_executors_need_no_file(tmp_path: Path) -> None:
    (tmp_path / "me.pem").write_text("CERT")
    (tmp_path / "me.key").write_text("KEY")
    options = java_kafka_options(SERVERS, {
        "security.protocol": "SSL", "ssl.ca.pem": "CA",
        "ssl.certificate.location": str(tmp_path / "me.pem"),
        "ssl.key.location": str(tmp_path / "me.key"), "ssl.key.password": "k",
        "ssl.endpoint.identification.algorithm": "none"})
    assert options == {
        "kafka.bootstrap.servers": SERVERS, "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.certificates": "CA",
        "kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.certificate.chain": "CERT",
        "kafka.ssl.keystore.key": "KEY", "kafka.ssl.key.password": "k",
        "kafka.ssl.endpoint.identification.algorithm": ""}


def test_plain_sasl_without_tls_and_plaintext() -> None:
    assert java_kafka_options(SERVERS, {}) == {"kafka.bootstrap.servers": SERVERS,
                                               "kafka.security.protocol": "PLAINTEXT"}
    options = java_kafka_options(SERVERS, {"security.protocol": "sasl_plaintext",
                                           "sasl.mechanisms": "PLAIN", "sasl.username": "u",
                                           "sasl.password": "p"})
    assert options["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" '
        'password="p";')
    assert options["kafka.security.protocol"] == "SASL_PLAINTEXT"


def test_what_cannot_be_translated_is_named_and_overrides_stand_in() -> None:
    oauth = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
             "sasl.oauthbearer.client.id": "c"}
    with pytest.raises(KafkaOptionsError, match=r"sasl.mechanism=OAUTHBEARER: give "
                                                r"sasl.jaas.config"):
        java_kafka_options(SERVERS, oauth)
    with pytest.raises(KafkaOptionsError, match=r"ssl.crl.location"):
        java_kafka_options(SERVERS, {"security.protocol": "SSL", "ssl.crl.location": "/x"})
    with pytest.raises(KafkaOptionsError, match=r"cannot read ssl.ca.location=/nowhere/ca.pem"):
        java_kafka_options(SERVERS, {"security.protocol": "SSL",
                                     "ssl.ca.location": "/nowhere/ca.pem"})
    options = java_kafka_options(SERVERS, {"security.protocol": "SSL",
                                           "ssl.crl.location": "/x"},
                                 {"kafka.ssl.truststore.location": "/etc/trust.jks"})
    assert options["kafka.ssl.truststore.location"] == "/etc/trust.jks"


def test_the_config_gives_both_connectors_the_same_security() -> None:
    config = StreamingStateConfig("shop", "op", SERVERS, client_config={
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u",
        "sasl.password": "p", "ssl.ca.pem": "CA"})
    assert config.spark_kafka_options()["kafka.sasl.jaas.config"].endswith(
        'username="u" password="p";')
    assert config.reader_options() == {
        "kafka.bootstrap.servers": SERVERS, "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.username": "u",
        "kafka.sasl.password": "p", "kafka.ssl.ca.pem": "CA", "application": "shop",
        "checkpoint.topic": "kafka-changelog-checkpoints"}
    assert config.writer_options() == {
        **config.reader_options(), "operator": "op",
        "changelog.topic": "kafka-changelog-shop-changelog",
        "snapshot.topic": "kafka-changelog-shop-snapshots", "maxParallelism": "128",
        "partitions": "16"}
