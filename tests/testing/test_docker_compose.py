"""The compose file's broker has exactly the local test broker's settings, on the host's
network, with ``apache/kafka`` as the default image; the demo image has what it needs.

(``tests/container/test_compose_demo.py`` runs the file end to end.)
"""

from __future__ import annotations

import re
from pathlib import Path

from kafka_changelog.local_kafka.config import (
    ClusterSpec,
    NodeSpec,
    broker_properties,
    docker_environment,
)
from kafka_changelog.local_kafka.jars import KAFKA_VERSION

COMPOSE = Path(__file__).resolve().parents[2] / "docker" / "docker-compose.yml"
DOCKERFILE = COMPOSE.parent / "Dockerfile"
COMPOSE_NODE = NodeSpec(node_id=1, client_port=9092, controller_port=9093,
                        log_dir="/var/lib/kafka/data")
"""The node the compose file runs: 127.0.0.1:9092 for clients, 9093 for the controller."""


def compose_properties() -> dict[str, str]:
    """``broker_properties`` of the compose file's node."""
    return broker_properties(COMPOSE_NODE, ClusterSpec((COMPOSE_NODE,), static_quorum=True))


def compose_environment() -> dict[str, str]:
    """The ``KAFKA_*: "value"`` lines of the compose file's ``kafka`` service."""
    pattern = re.compile(r'^\s+(KAFKA_[A-Z0-9_]+):\s+"([^"]*)"\s*$')
    kafka_service = COMPOSE.read_text().split("\n  kafka:\n", 1)[1].split("\n  demo:\n", 1)[0]
    found = {}
    for line in kafka_service.splitlines():
        match = pattern.match(line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def test_compose_has_exactly_the_local_brokers_settings() -> None:
    assert compose_environment() == docker_environment(compose_properties())


def test_compose_defaults_to_the_official_image_of_the_same_version() -> None:
    text = COMPOSE.read_text()
    assert f"image: ${{KAFKA_IMAGE:-apache/kafka:{KAFKA_VERSION}}}" in text


def test_compose_uses_the_host_network_and_publishes_nothing() -> None:
    text = COMPOSE.read_text()
    assert text.count("network_mode: host") == 2  # kafka and demo
    assert "network: host" in text  # the demo's build
    assert "ports:" not in text
    assert 'KAFKA_BOOTSTRAP_SERVERS: "127.0.0.1:9092"' in text


def test_the_demo_image_has_python_java_maven_and_the_connector() -> None:
    text = COMPOSE.read_text()
    assert "dockerfile: docker/Dockerfile" in text
    dockerfile = DOCKERFILE.read_text()
    for package in ("python3-venv", "openjdk-17-jre-headless", "maven", "kcat"):
        assert package in dockerfile, package
    assert 'pip install --no-cache-dir ".[spark]"' in dockerfile
    assert "python -m spark_integration.sessions.connector" in dockerfile
    assert "COPY examples ./examples" in dockerfile
    assert "examples.streaming_demo" in dockerfile
