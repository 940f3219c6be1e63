"""The compose file's broker agrees with the local test broker's settings."""

from __future__ import annotations

import re
from pathlib import Path

from kafka_changelog.local_kafka.config import COMMON_BROKER_SETTINGS

COMPOSE = Path(__file__).resolve().parents[2] / "docker" / "docker-compose.yml"


def compose_settings() -> dict[str, str]:
    """``KAFKA_FOO_BAR: "v"`` lines as ``{"foo.bar": "v"}`` (the image's own mapping)."""
    pattern = re.compile(r'^\s+KAFKA_([A-Z0-9_]+):\s+"([^"]*)"\s*$')
    found = {}
    for line in COMPOSE.read_text().splitlines():
        match = pattern.match(line)
        if match:
            found[match.group(1).lower().replace("_", ".")] = match.group(2)
    return found


def test_compose_matches_the_common_broker_settings() -> None:
    settings = compose_settings()
    for name, value in COMMON_BROKER_SETTINGS.items():
        assert settings.get(name) == value, f"{name}: compose {settings.get(name)!r} != {value!r}"


def test_compose_runs_the_same_kafka_version() -> None:
    from kafka_changelog.local_kafka.jars import KAFKA_VERSION

    assert f"image: apache/kafka:{KAFKA_VERSION}" in COMPOSE.read_text()
    assert '- "9092:9092"' in COMPOSE.read_text()


def test_compose_runs_the_demo_against_its_broker() -> None:
    text = COMPOSE.read_text()
    assert 'KAFKA_BOOTSTRAP_SERVERS: "kafka:29092"' in text
    assert "INTERNAL://kafka:29092" in text
    assert "dockerfile: docker/Dockerfile" in text
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    assert 'pip install --no-cache-dir ".[spark]"' in dockerfile
    assert "COPY examples ./examples" in dockerfile
    assert "examples.streaming_demo" in dockerfile
