"""``docker/docker-compose.yml`` end to end: its broker, then a job in the demo image
against it.

The broker serves clients with the compose file's settings (a produce round trip; its
``server.properties`` are the local test broker's). The demo image builds and has
everything a run needs, offline (Java, PySpark, Spark's Kafka connector jars, the library
and the example application): one stateful streaming run of the clickstream job
(``examples.clickstream``: Spark's Kafka source, exactly-once outputs) in the demo
container against the compose broker, checked exactly from the host: the state read back
equals the state computed from the events, the output topic holds every batch's outputs
once with the right totals. The full demo flow (four drivers, two killed -9, the reader
session) is checked by ``tests/spark/test_demo.py`` on a local broker.

Run with Debian's compose client (``docker-compose`` 1.29, installed with ``apt-get`` if
missing), the broker on the locally built stand-in for ``apache/kafka`` (``KAFKA_IMAGE``),
the demo image built from ``docker/Dockerfile`` on the local Debian base
(``DEMO_BASE_IMAGE``). Users run the same file with ``docker compose`` and the defaults.

The compose file's broker listens on 127.0.0.1:9092 and 9093 (host network): both ports
must be free, or the test fails naming them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from examples.clickstream import expected_state, output_problems, produce_events, read_outputs
from examples.events import events
from kafka_changelog.local_kafka.errors import DockerUnavailableError
from kafka_changelog.local_kafka.probe import produce_round_trip, quiet, wait_for_brokers
from kafka_changelog.testing.docker_engine import DockerEngine, is_root
from kafka_changelog.testing.images import BASE_IMAGE, ensure_base_image, prune_dangling_images
from spark_integration.streaming.worker_resources import WorkerResources
from tests.container.test_container_image import parse_properties
from tests.spark.jobs import Job, state_of
from tests.testing.test_docker_compose import COMPOSE, compose_properties

pytestmark = [pytest.mark.broker, pytest.mark.container, pytest.mark.spark]

BOOTSTRAP = "127.0.0.1:9092"
#: The job's input: a few batches, every user in several of them.
EVENTS = 240
USERS = 20
PER_BATCH = 80
#: Maven in the container cannot use a local repository here: a run that needed a jar not
#: already in the image would fail instead of downloading it.
NO_MAVEN = "MAVEN_OPTS=-Dmaven.repo.local=/dev/null/m2"
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")


def compose_client() -> str:
    """Debian's ``docker-compose``, installed with apt-get (as root) if missing."""
    found = shutil.which("docker-compose")
    if found:
        return found
    if not is_root():
        raise DockerUnavailableError(
            "docker-compose is not installed and this is not root: apt-get install docker-compose")
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                    "docker-compose"], check=True, capture_output=True,
                   env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    found = shutil.which("docker-compose")
    assert found is not None, "docker-compose is still missing after apt-get install"
    return found


def require_free_ports(*ports: int) -> None:
    for port in ports:
        with socket.socket() as probe:
            # As Kafka binds: connections of an earlier broker in TIME_WAIT do not count.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as exc:
                raise AssertionError(
                    f"port {port} is taken; the compose file's broker needs it") from exc


class Compose:
    """``docker-compose -p <unique project> -f docker/docker-compose.yml`` on ``engine``."""

    def __init__(self, engine: DockerEngine, env: dict[str, str]) -> None:
        self.argv = [compose_client(), "-p", f"kcdemo{uuid.uuid4().hex[:8]}", "-f", str(COMPOSE)]
        self.env = engine.env(env)

    def __call__(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*self.argv, *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)
        assert done.returncode == 0, (
            f"docker-compose {' '.join(args)} failed ({done.returncode}):\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done


@pytest.fixture
def compose(docker_engine: DockerEngine, kafka_image: str) -> Iterator[Compose]:
    ensure_base_image(docker_engine)
    # The CA certificates this machine trusts besides Debian's (a TLS-inspecting proxy in
    # front of PyPI / Maven Central): the demo image's build needs them too.
    pem = "".join(p.read_text() for p in sorted(EXTRA_CA_DIR.glob("*.crt")))
    running = Compose(docker_engine, {
        "KAFKA_IMAGE": kafka_image, "DEMO_BASE_IMAGE": BASE_IMAGE, "EXTRA_CA_PEM": pem,
        # docker-compose 1.29 builds through the engine's API (its layer cache).
        "COMPOSE_DOCKER_CLI_BUILD": "0", "DOCKER_BUILDKIT": "0",
    })
    require_free_ports(9092, 9093)
    try:
        yield running
    finally:
        running("down", "-v", "--remove-orphans", timeout=120)
        # A demo image replaced by a rebuild (its inputs changed) is not kept.
        prune_dangling_images(docker_engine)


def test_the_compose_broker_serves_clients_and_the_demo_image_runs_a_job_against_it(
    compose: Compose,
) -> None:
    compose("up", "-d", "kafka")
    admin = AdminClient(quiet({"bootstrap.servers": BOOTSTRAP}))
    deadline = time.monotonic() + 120
    wait_for_brokers(admin, [1], deadline, lambda: None)
    produce_round_trip(admin, {"bootstrap.servers": BOOTSTRAP}, 1, deadline, lambda: None)
    # The compose file's settings, given to the stand-in image, are the local broker's.
    printed = compose("exec", "-T", "kafka", "cat", "/opt/kafka/config/server.properties")
    assert parse_properties(printed.stdout) == compose_properties()

    compose("build", "--force-rm", "demo")
    settings = {"bootstrap.servers": BOOTSTRAP}
    # The checkpointLocation is in the container (gone with it); the state is in Kafka.
    job = Job(f"compose-{uuid.uuid4().hex[:8]}", BOOTSTRAP, Path("/tmp/checkpoint"),
              EVENTS, per_batch=PER_BATCH)
    produce_events(settings, job.input_topic, EVENTS, USERS)
    # The job's command line with the image's interpreter, from the image's /app.
    command = ["python", *job.command(parallelism=2)[1:]]
    done = compose("run", "--rm", "-T", "-e", NO_MAVEN, "demo", *command, timeout=600)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["batches"] >= EVENTS // PER_BATCH, summary
    expected = expected_state(events(EVENTS, USERS))
    try:
        assert state_of(job.config(), sorted(expected)) == expected
    finally:
        WorkerResources.release(job.config())
    assert output_problems(read_outputs(settings, job.output_topic), expected) == []
