"""The locally built Kafka image and ``apache/kafka`` agree: same ``KAFKA_*`` convention.

The image turns the environment ``docker_environment(props)`` back into exactly ``props``
(the inverse of the official image's mapping: ``.`` -> ``_``, ``_`` -> ``__``, ``-`` ->
``___``), so the settings the project hands ``apache/kafka`` mean the same to it.
"""

from __future__ import annotations

import pytest

from kafka_changelog.local_kafka.config import (
    ClusterSpec,
    NodeSpec,
    broker_properties,
    docker_environment,
)
from kafka_changelog.testing.container import HEAP_OPTS, ContainerKafkaCluster
from kafka_changelog.testing.docker_engine import DockerEngine

pytestmark = [pytest.mark.broker, pytest.mark.container]


def parse_properties(text: str) -> dict[str, str]:
    """``key=value`` lines (no escapes are needed by these settings)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found[key] = value
    return found


def printed_config(engine: DockerEngine, image: str, env: dict[str, str]) -> dict[str, str]:
    """The ``server.properties`` the image makes of ``env`` (no network: it only prints)."""
    args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    result = engine.docker("run", "--rm", "--network", "none", *args, image, "print-config")
    return parse_properties(result.stdout)


def test_the_image_makes_broker_properties_of_their_environment(
    docker_engine: DockerEngine, kafka_image: str
) -> None:
    node = NodeSpec(node_id=3, client_port=19092, controller_port=19093,
                    log_dir="/var/lib/kafka/data")
    spec = ClusterSpec((node,), static_quorum=True, overrides={
        "log.cleaner.backoff.ms": "100",
        # Names with '_' and '-' exercise the escapes of the convention.
        "transaction.state.log.min.isr": "1",
        "confluent.some_setting-with.dash": "x",
    })
    props = broker_properties(node, spec)
    env = docker_environment(props) | {"KAFKA_HEAP_OPTS": HEAP_OPTS, "CLUSTER_ID": "abc"}
    assert env["KAFKA_CONFLUENT_SOME__SETTING___WITH_DASH"] == "x"
    # JVM options and the cluster id are not broker settings, in either image.
    assert printed_config(docker_engine, kafka_image, env) == props


def test_a_running_container_has_the_local_brokers_settings(
    shared_container_cluster: ContainerKafkaCluster,
) -> None:
    cluster = shared_container_cluster
    text = cluster.engine.docker(
        "exec", cluster.name, "cat", "/opt/kafka/config/server.properties").stdout
    assert parse_properties(text) == broker_properties(cluster.node, cluster.cluster_spec)
    # Host network, loopback only: the broker listens and advertises 127.0.0.1.
    assert parse_properties(text)["listeners"].count("127.0.0.1") == 2
    inspected = cluster.engine.docker(
        "inspect", "--format", "{{.HostConfig.NetworkMode}}", cluster.name).stdout.strip()
    assert inspected == "host"
