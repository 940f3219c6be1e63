"""The whole product against SASL_SSL with ACLs, as a user with least privilege runs it.

The security settings are given once (``-X`` to the clickstream job, ``client_config`` of
:class:`StreamingStateConfig`): the job's Kafka input through Spark's connector, its state,
its exactly-once outputs, the ``kafka-changelog`` reader and every read command of the CLI
all connect as ``alice`` over TLS, with only the ACLs docs/operations.md lists.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from examples.clickstream import (
    expected_state,
    output_problems,
    outputs_with_spark,
    produce_events,
    read_outputs,
)
from examples.events import events
from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from kafka_changelog.testing.pytest_plugin import SECURE_USERS
from spark_integration import register
from tests.spark.jobs import REPO, Job

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.security]

EVENTS, USERS = 600, 15


def grant_application(cluster: LocalKafkaCluster, user: str, app: str) -> None:
    """What an application's principal needs (docs/operations.md, "ACLs"): its topics and
    transactional ids by prefix, the topic-owner registry, and Spark's source groups."""
    cluster.grant(user, "TOPIC", app, ["CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ",
                                       "WRITE", "DELETE"], pattern_type="PREFIXED")
    cluster.grant(user, "TOPIC", f"kafka-changelog-{app}-", ["CREATE", "DESCRIBE",
                                                            "DESCRIBE_CONFIGS", "READ",
                                                            "WRITE", "DELETE"],
                  pattern_type="PREFIXED")
    cluster.grant(user, "TRANSACTIONAL_ID", f"kafka-changelog-{app}-", ["WRITE", "DESCRIBE"],
                  pattern_type="PREFIXED")
    cluster.grant(user, "TOPIC", "kafka-changelog-topic-owners",
                  ["CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ", "WRITE"])
    cluster.grant(user, "GROUP", "spark-kafka-source-", ["READ"], pattern_type="PREFIXED")


def cli(settings: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    options = [arg for key, value in settings.items() if key != "bootstrap.servers"
               for arg in ("-X", f"{key}={value}")]
    return subprocess.run([sys.executable, "-m", "kafka_changelog.cli", "-b",
                           settings["bootstrap.servers"], *options, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=180)


def test_streaming_reader_and_cli_over_sasl_ssl_with_least_privilege(
        secure_kafka_cluster: LocalKafkaCluster, spark: Any, tmp_path: Path) -> None:
    app = f"tls-{uuid.uuid4().hex[:8]}"
    grant_application(secure_kafka_cluster, "alice", app)
    alice = secure_kafka_cluster.client_config("alice", SECURE_USERS["alice"])
    job = Job(app, alice["bootstrap.servers"], tmp_path / "checkpoint", EVENTS,
              per_batch=150, client_config=tuple(
                  (k, str(v)) for k, v in alice.items() if k != "bootstrap.servers"))
    produce_events(alice, job.input_topic, EVENTS, USERS)

    done = job.run(parallelism=2, timeout_s=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    expected = expected_state(events(EVENTS, USERS))

    # The exactly-once outputs, read by us and by Spark's connector with the same security.
    config = job.config()
    outputs = read_outputs(alice, job.output_topic)
    assert output_problems(outputs, expected) == []
    with_spark = outputs_with_spark(spark, config.spark_kafka_options(), job.output_topic)
    assert sorted(tuple(row) for row in with_spark.collect()) == sorted(outputs)

    # The state, read by the reader with the same settings.
    register(spark)
    rows = (spark.read.format("kafka-changelog").options(**config.reader_options())
            .option("mode", "state").load().where("state = 'events'")
            .select("key_decoded", "value_decoded").collect())
    assert {r["key_decoded"]: int(r["value_decoded"]) for r in rows} == {
        user: s["events"] for user, s in expected.items()}

    # Every read command of the CLI, as alice over TLS.
    listed = cli(alice, "--checkpoint-topic", config.checkpoint_topic, "applications",
                 "--json")
    assert listed.returncode == 0, listed.stderr
    assert [a["application"] for a in json.loads(listed.stdout)] == [app]
    shown = cli(alice, "--checkpoint-topic", config.checkpoint_topic, "checkpoints", app)
    assert shown.returncode == 0, shown.stderr
    user = sorted(expected)[3]
    state = cli(alice, "--checkpoint-topic", config.checkpoint_topic, "state", app,
                "--operator", config.operator_id, "--key", user, "--json")
    assert state.returncode == 0, state.stderr
    found = {s["state"]: s["value"] for s in json.loads(state.stdout)["states"]}
    assert found["events"] == expected[user]["events"]
    verified = cli(alice, "--checkpoint-topic", config.checkpoint_topic, "verify", app)
    assert verified.returncode == 0, verified.stdout + verified.stderr
