"""TLS as real clusters speak it: mutual TLS (a client's principal is its certificate's
CN), and each way a TLS connection goes wrong failing within seconds with its own
exception, naming what to fix."""

from __future__ import annotations

import re
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
from kafka_changelog.kafka.access import connect_admin
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


# -- docs/security.md's profiles --------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def profiles() -> dict[str, tuple[bool, dict[str, str]]]:
    """docs/security.md's ``# profile: NAME [(tested)]`` blocks: whether each is marked
    tested, and its ``client_config``."""
    found = {}
    for block in re.findall(r"```python\n(# profile: .*?)```", DOCS.read_text(), re.S):
        header = block.splitlines()[0].removeprefix("# profile: ")
        scope: dict[str, Any] = {}
        exec(block, scope)  # the documentation's own example
        found[header.split()[0]] = ("(tested)" in header, scope["client_config"])
    return found


def filled(profile: dict[str, str], cluster: LocalKafkaCluster, user: str
           ) -> dict[str, str]:
    """A profile's settings with its placeholders for ``cluster`` and ``user``."""
    assert cluster.security is not None
    tls, password = cluster.tls, cluster.security.users[user]
    values = {"<user>": user, "<password>": password, "<ca.pem>": str(tls.authority.certificate),
              "<service.cert>": str(tls.clients[user].certificate),
              "<service.key>": str(tls.clients[user].key)}
    settings = {k: values.get(v, v) for k, v in profile.items()}
    assert not [v for v in settings.values() if v.startswith("<")], settings
    return {"bootstrap.servers": cluster.bootstrap_servers, **settings}


def test_the_documented_profiles_are_all_there_and_translate_for_spark(tmp_path: Path) -> None:
    from spark_integration.sessions.kafka_options import java_kafka_options

    documented = profiles()
    assert sorted(documented) == ["aiven-mtls", "aiven-sasl", "confluent-cloud", "msk-mtls",
                                  "msk-scram", "on-premises"]
    assert sorted(n for n, (tested, _) in documented.items() if tested) == [
        "aiven-mtls", "aiven-sasl", "on-premises"]
    pem = tmp_path / "any.pem"
    pem.write_text("PEM")
    for name, (_, profile) in documented.items():
        settings = {k: (str(pem) if v.startswith("<") and k.endswith("location") else v)
                    for k, v in profile.items()}
        options = java_kafka_options("broker:9093", settings)
        assert options["kafka.security.protocol"] == profile["security.protocol"], name


def test_the_tested_sasl_ssl_profiles_connect(secure_kafka_cluster: LocalKafkaCluster) -> None:
    for name in ("aiven-sasl", "on-premises"):
        _, profile = profiles()[name]
        _, metadata = connect_admin(filled(profile, secure_kafka_cluster, "alice"), 15)
        assert metadata.brokers, name


def test_the_tested_mutual_tls_profile_connects(mtls_cluster: LocalKafkaCluster) -> None:
    _, profile = profiles()["aiven-mtls"]
    _, metadata = connect_admin(filled(profile, mtls_cluster, "alice"), 15)
    assert metadata.brokers


def test_kcat_replays_a_handle_over_mutual_tls_with_the_printed_commands(
        mtls_cluster: LocalKafkaCluster) -> None:
    """What ``kafka-changelog kcat`` prints for a handle carries the client's TLS settings:
    real kcat, given them, replays exactly the handle's records."""
    import base64
    import subprocess
    import sys

    topic = f"mtls-kcat-{uuid.uuid4().hex[:8]}"
    settings = mtls_cluster.client_config("alice")
    KafkaChangelogStorage(config_of(mtls_cluster.client_config(), topic)).close()
    mtls_cluster.grant("alice", "TOPIC", topic, ["DESCRIBE", "DESCRIBE_CONFIGS", "READ",
                                                 "WRITE"])
    with KafkaChangelogStorage(config_of(settings, topic)) as storage, storage.create_writer(
            "op", KeyGroupRange.of(0, 127)) as writer:
        for kg in (1, 70, 120):
            writer.append(kg, b"value-%d" % kg)
        handle = writer.persist(writer.initial_sequence_number(), 1).result(30).job_owned
    options = [a for k, v in settings.items() if k != "bootstrap.servers"
               for a in ("-X", f"{k}={v}")]
    printed = subprocess.run([sys.executable, "-m", "kafka_changelog.cli", "-b",
                              settings["bootstrap.servers"], *options, "kcat",
                              base64.b64encode(handle.to_bytes()).decode()],
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    replayed = ""
    for command in printed.stdout.splitlines():
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, command + "\n" + done.stderr[-600:]
        replayed += done.stdout
    assert replayed.count("key=op") == 2  # one record per partition range: 2 partitions
    assert "kc.schema=change_batch/2" in replayed
