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
