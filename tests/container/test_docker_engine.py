"""The Docker engine of the container tests, and the images built here.

The engine answers; one started here runs without a bridge network or firewall rules, with
its own data root; the images are built once and found again by the hash of their inputs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kafka_changelog.local_kafka.jars import KAFKA_VERSION
from kafka_changelog.testing.container import DEFAULT_IMAGE, IMAGE_ENV, default_image
from kafka_changelog.testing.docker_engine import DATA_ROOT, PID_FILE, DockerEngine
from kafka_changelog.testing.images import (
    BASE_IMAGE,
    INPUTS_LABEL,
    KAFKA_IMAGE,
    ensure_kafka_image,
    image_with_inputs,
)

pytestmark = pytest.mark.container


def test_the_engine_answers_without_a_bridge_network(docker_engine: DockerEngine) -> None:
    assert docker_engine.docker("version", "--format", "{{.Server.Version}}").stdout.strip()
    if not docker_engine.started_here:
        pytest.fail("expected the tests' own dockerd (root, no engine running before)")
    networks = docker_engine.docker("network", "ls", "--format", "{{.Driver}}").stdout.split()
    assert "bridge" not in networks
    cmdline = Path(f"/proc/{int(PID_FILE.read_text())}/cmdline").read_bytes().split(b"\0")
    for flag in (b"--bridge=none", b"--iptables=false", b"--ip-forward=false",
                 f"--data-root={DATA_ROOT}".encode()):
        assert flag in cmdline, flag


def test_images_are_built_once_and_found_by_their_inputs(
    docker_engine: DockerEngine, kafka_image: str
) -> None:
    assert kafka_image == KAFKA_IMAGE
    label = docker_engine.docker(
        "image", "inspect", "--format", f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}',
        KAFKA_IMAGE).stdout.strip()
    assert image_with_inputs(docker_engine, KAFKA_IMAGE, label)
    assert image_with_inputs(docker_engine, KAFKA_IMAGE, "other inputs") is None
    before = docker_engine.docker("image", "inspect", "--format", "{{.Id}}", KAFKA_IMAGE).stdout
    started = time.monotonic()
    assert ensure_kafka_image(docker_engine) == KAFKA_IMAGE
    assert time.monotonic() - started < 30  # hashing the jars, no build
    after = docker_engine.docker("image", "inspect", "--format", "{{.Id}}", KAFKA_IMAGE).stdout
    assert before == after
    base = docker_engine.docker("run", "--rm", "--network", "none", BASE_IMAGE,
                                "cat", "/etc/debian_version").stdout
    assert base.startswith("12.")


def test_users_get_the_official_image_unless_they_name_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(IMAGE_ENV, raising=False)
    assert default_image() == DEFAULT_IMAGE == f"apache/kafka:{KAFKA_VERSION}"
    monkeypatch.setenv(IMAGE_ENV, "registry.example/kafka:x")
    assert default_image() == "registry.example/kafka:x"
