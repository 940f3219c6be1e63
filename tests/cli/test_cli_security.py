"""The read-only commands need READ and DESCRIBE on the three topics, nothing more."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from kafka_changelog.testing.pytest_plugin import SECURE_USERS

from .cli_helpers import Deployment, Operator, Topics, cli, clicks_work

pytestmark = [pytest.mark.broker, pytest.mark.security]


def _as_alice(cluster: Any, topics: Topics, *args: str) -> list[str]:
    settings = dict(cluster.client_config(user="alice", password=SECURE_USERS["alice"]))
    options = ["-b", settings.pop("bootstrap.servers")]
    for key, value in settings.items():
        options += ["-X", f"{key}={value}"]
    return [*options, "--changelog-topic", topics.changelog, "--snapshot-topic",
            topics.snapshot, "--checkpoint-topic", topics.checkpoint, *args]


def test_read_only_commands_with_read_and_describe_acls_only(secure_kafka_cluster: Any) -> None:
    topics = Topics.fresh()
    deployment = Deployment(secure_kafka_cluster, "alpha", topics)  # as the admin
    try:
        operators = {"clicks": Operator(2, clicks_work("user", 6))}
        deployment.run_round(1, operators, 1, int(time.time() * 1000) - 3_600_000,
                             materialize=True)
        deployment.run_round(2, operators, 2, int(time.time() * 1000) - 3_600_000,
                             materialize=False)
    finally:
        deployment.close()
    for topic in topics.all():
        secure_kafka_cluster.grant("alice", "TOPIC", topic, ["READ", "DESCRIBE"])

    listed = cli(*_as_alice(secure_kafka_cluster, topics, "applications", "--json"))
    assert listed.returncode == 0, listed.stderr
    assert [a["application"] for a in json.loads(listed.stdout)] == ["alpha"]
    shown = cli(*_as_alice(secure_kafka_cluster, topics, "checkpoints", "alpha"))
    assert shown.returncode == 0, shown.stderr
    state = cli(*_as_alice(secure_kafka_cluster, topics, "state", "alpha", "--operator",
                           "clicks", "--key", "user-2", "--json"))
    assert state.returncode == 0, state.stderr
    assert {s["state"]: s["value"] for s in json.loads(state.stdout)["states"]}["count"] == 22
    verified = cli(*_as_alice(secure_kafka_cluster, topics, "verify", "alpha"))
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # Writing is another matter: reset names what it was refused.
    refused = cli(*_as_alice(secure_kafka_cluster, topics, "reset", "alpha", "--yes"))
    assert refused.returncode == 2, refused.stderr
    assert (f"kafka-changelog: error: producing 6 chunk tombstones of application 'alpha' to "
            f"{topics.snapshot}[") in refused.stderr
    assert (f"] failed: SASL_SSL user 'alice' lacks the ACL IDEMPOTENT_WRITE on Cluster "
            f"'kafka-cluster', or WRITE on Topic '{topics.snapshot}', which implies it "
            "(CLUSTER_AUTHORIZATION_FAILED") in refused.stderr
    assert "Traceback" not in refused.stderr



def test_handle_and_topic_commands_over_sasl_ssl(secure_kafka_cluster: Any) -> None:
    """``dump`` and ``topics`` as alice over TLS; ``kcat`` prints commands with her settings
    and no password (the shell takes it from $KAFKA_SASL_PASSWORD). (Real kcat replays
    over TLS in tests/kafka/test_kafka_tls.py: Debian's kcat, librdkafka 2.0.2, cannot do
    SCRAM with Kafka 4 brokers.)"""
    import base64
    import uuid

    from kafka_changelog import KeyGroupRange
    from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage

    topic = f"cli-tls-{uuid.uuid4().hex[:8]}"
    alice = dict(secure_kafka_cluster.client_config(user="alice",
                                                    password=SECURE_USERS["alice"]))
    servers = alice.pop("bootstrap.servers")
    admin = dict(secure_kafka_cluster.client_config())
    admin.pop("bootstrap.servers")
    config = KafkaChangelogConfig(bootstrap_servers=servers, client_config=admin, topic=topic,
                                  partitions=2, max_parallelism=8)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
            "op", KeyGroupRange.of(0, 7)) as writer:
        for kg in range(8):
            writer.append(kg, b"value-%d" % kg)
        handle = writer.persist(writer.initial_sequence_number(), 1).result(30).job_owned
    secure_kafka_cluster.grant("alice", "TOPIC", topic, ["READ", "DESCRIBE",
                                                         "DESCRIBE_CONFIGS"])
    as_alice = ["-b", servers, *[a for k, v in alice.items() for a in ("-X", f"{k}={v}")]]
    encoded = base64.b64encode(handle.to_bytes()).decode()

    dumped = cli(*as_alice, "dump", encoded)
    assert dumped.returncode == 0, dumped.stderr
    assert sorted(json.loads(line).get("payload_utf8") for line in
                  dumped.stdout.splitlines()) == sorted(f"value-{kg}" for kg in range(8))

    shown = cli(*as_alice, "topics", "--topic", topic, "--partitions", "2")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["partitions"] == 2

    printed = cli(*as_alice, "kcat", encoded)
    assert printed.returncode == 0, printed.stderr
    assert printed.stderr.strip() == (
        "kafka-changelog: kcat: the commands read KAFKA_SASL_PASSWORD from the environment: "
        "export them before running them")
    commands = printed.stdout.splitlines()
    assert len(commands) == 2
    for command in commands:
        assert SECURE_USERS["alice"] not in command  # the secret is never printed
        assert (" -X security.protocol=SASL_SSL -X sasl.mechanism=SCRAM-SHA-256 -X "
                "sasl.username=alice -X sasl.password=\"$KAFKA_SASL_PASSWORD\" -X "
                f"ssl.ca.location={alice['ssl.ca.location']} -t {topic} ") in command
