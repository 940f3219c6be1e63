"""TLS as real clusters speak it: mutual TLS (a client's principal is its certificate's
CN), and each way a TLS connection goes wrong failing within seconds with its own
exception, naming what to fix."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog import (
    BrokerHostnameMismatchError,
    ClientCertificateRejectedError,
    KafkaUnreachableError,
    KeyGroupRange,
    UntrustedBrokerCertificateError,
)
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from kafka_changelog.local_kafka.net import free_ports
from kafka_changelog.local_kafka.security import SecurityConfig, SecurityProtocol
from kafka_changelog.local_kafka.tls import CertificateAuthority
from tests.kafka.kafka_helpers import changes_of

pytestmark = [pytest.mark.broker, pytest.mark.security]

USERS = {"admin": "admin-secret", "alice": "alice-secret"}
FAST_S = 8.0


@pytest.fixture(scope="module")
def mtls_cluster() -> Iterator[LocalKafkaCluster]:
    """One node whose listener speaks SSL and requires a client certificate (ACLs on)."""
    security = SecurityConfig(users=USERS, protocol=SecurityProtocol.SSL)
    with LocalKafkaCluster(security=security) as cluster:
        yield cluster


def config_of(settings: dict[str, Any], topic: str = "any") -> KafkaChangelogConfig:
    settings = dict(settings)
    return KafkaChangelogConfig(bootstrap_servers=settings.pop("bootstrap.servers"),
                                client_config=settings, topic=topic, partitions=2,
                                request_timeout_s=20, delivery_timeout_ms=10_000)


def refused_within(expected: type[Exception], settings: dict[str, Any]) -> str:
    """The message of ``expected``, raised by opening the storage within FAST_S."""
    started = time.monotonic()
    with pytest.raises(expected) as caught:
        KafkaChangelogStorage(config_of(settings))
    assert time.monotonic() - started < FAST_S, f"took {time.monotonic() - started:.1f} s"
    return str(caught.value)


def test_a_client_certificate_is_the_principal_its_acls_are_granted_to(
        mtls_cluster: LocalKafkaCluster) -> None:
    topic = f"mtls-{uuid.uuid4().hex[:8]}"
    KafkaChangelogStorage(config_of(mtls_cluster.client_config(), topic)).close()  # admin
    mtls_cluster.grant("alice", "TOPIC", topic, ["DESCRIBE", "DESCRIBE_CONFIGS", "READ",
                                                 "WRITE"])
    config = config_of(mtls_cluster.client_config("alice"), topic)
    assert config.client_config["security.protocol"] == "SSL"
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
            "op", KeyGroupRange.of(0, 127)) as writer:
        writer.append(3, b"over mutual TLS")
        handle = writer.persist(writer.initial_sequence_number(), 1).result(30).job_owned
    assert [c.payload for c in changes_of(handle, config)] == [b"over mutual TLS"]


def test_a_client_trusting_another_authority_is_told_the_broker_is_untrusted(
        mtls_cluster: LocalKafkaCluster, tmp_path: Path) -> None:
    other = CertificateAuthority.create(tmp_path / "other")
    settings = {**mtls_cluster.client_config("alice"), "ssl.ca.location": str(other.certificate)}
    message = refused_within(UntrustedBrokerCertificateError, settings)
    assert message.startswith(f"the certificate of the broker at "
                              f"{mtls_cluster.bootstrap_servers} is not signed by an "
                              f"authority the client trusts (ssl.ca.location="
                              f"{other.certificate})")


def test_a_client_certificate_from_another_authority_is_refused_by_name(
        mtls_cluster: LocalKafkaCluster, tmp_path: Path) -> None:
    stranger = CertificateAuthority.create(tmp_path / "other").issue("alice")
    settings = {**mtls_cluster.client_config("alice"),
                "ssl.certificate.location": str(stranger.certificate),
                "ssl.key.location": str(stranger.key)}
    message = refused_within(ClientCertificateRejectedError, settings)
    assert message.startswith(f"the broker at {mtls_cluster.bootstrap_servers} refused the "
                              f"client certificate {stranger.certificate} (TLS alert "
                              "certificate unknown)")


def test_no_client_certificate_where_one_is_required_says_what_to_set(
        mtls_cluster: LocalKafkaCluster) -> None:
    settings = {k: v for k, v in mtls_cluster.client_config("alice").items()
                if k not in ("ssl.certificate.location", "ssl.key.location")}
    message = refused_within(ClientCertificateRejectedError, settings)
    assert message.startswith(f"the broker at {mtls_cluster.bootstrap_servers} requires a "
                              "client certificate and none is configured: set "
                              "ssl.certificate.location and ssl.key.location")


def test_a_plaintext_client_at_a_tls_listener_is_told_to_speak_tls(
        mtls_cluster: LocalKafkaCluster) -> None:
    settings = {"bootstrap.servers": mtls_cluster.bootstrap_servers}
    message = refused_within(KafkaUnreachableError, settings)
    assert message == (f"the broker at {mtls_cluster.bootstrap_servers} speaks TLS and the "
                       "client security.protocol is PLAINTEXT: set security.protocol to SSL "
                       "or SASL_SSL (and ssl.ca.location)")


def test_a_certificate_for_another_host_name_is_a_hostname_mismatch() -> None:
    """Clients are told ``localhost``, the certificate names only that: a client that
    bootstraps at 127.0.0.1 meets a trusted certificate for another name."""
    security = SecurityConfig(users=USERS, protocol=SecurityProtocol.SASL_SSL)
    with LocalKafkaCluster(security=security, advertised_host="localhost",
                           tls_hosts=["localhost"]) as cluster:
        settings = cluster.client_config("alice")
        by_address = settings["bootstrap.servers"].replace("localhost", "127.0.0.1")
        message = refused_within(BrokerHostnameMismatchError,
                                 {**settings, "bootstrap.servers": by_address})
        assert message.startswith(f"the certificate of the broker at {by_address} is trusted "
                                  "but is for localhost, not '127.0.0.1'")


def test_nothing_listening_is_unreachable_not_an_access_error() -> None:
    port = free_ports(1, "127.0.0.1")[0]
    started = time.monotonic()
    with pytest.raises(KafkaUnreachableError) as caught:
        KafkaChangelogStorage(KafkaChangelogConfig(
            bootstrap_servers=f"127.0.0.1:{port}", topic="any", request_timeout_s=3))
    assert time.monotonic() - started < FAST_S
    assert str(caught.value).startswith(
        f"no answer from Kafka at 127.0.0.1:{port} as PLAINTEXT within 3 s (nothing listens "
        f"at 127.0.0.1:{port}): ")
