"""A single-node Kafka cluster in a Docker container, on the host's network.

The image defaults to the official ``apache/kafka:<version>``; any image that follows its
conventions works, e.g. the locally built stand-in
(:func:`kafka_changelog.testing.images.ensure_kafka_image`). The broker settings are those
of the local-process cluster (:func:`~kafka_changelog.local_kafka.config.broker_properties`)
handed to the image as ``KAFKA_*`` environment variables.

Invariants:

* The container runs with ``--network host`` and its listeners bind 127.0.0.1 only, on
  free ports picked at :meth:`ContainerKafkaCluster.start`; no port is published, no
  bridge network is used.
* The broker's data is in a named volume that lives as long as the cluster object: after
  :meth:`~ContainerKafkaCluster.kill` (SIGKILL) :meth:`~ContainerKafkaCluster.restart`
  runs the same container (same ports, same settings) on the same data.
* :meth:`~ContainerKafkaCluster.stop` removes the container and the volume.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka.admin import AdminClient

from kafka_changelog.local_kafka.config import (
    ClusterSpec,
    NodeSpec,
    broker_properties,
    docker_environment,
)
from kafka_changelog.local_kafka.errors import (
    BrokerStartError,
    DockerUnavailableError,
    KafkaHarnessError,
)
from kafka_changelog.local_kafka.jars import KAFKA_VERSION
from kafka_changelog.local_kafka.jvm import new_cluster_id
from kafka_changelog.local_kafka.net import LOOPBACK, free_ports
from kafka_changelog.local_kafka.probe import (
    ProbeTimeout,
    produce_round_trip,
    quiet,
    wait_for_brokers,
)
from kafka_changelog.testing.docker_engine import DEFAULT_SOCKET, DockerEngine

DEFAULT_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
"""What users run; tests on machines without a registry use the locally built image."""
IMAGE_ENV = "KAFKA_CHANGELOG_KAFKA_IMAGE"
"""Environment variable naming the image instead of :data:`DEFAULT_IMAGE`."""
DATA_DIR = "/var/lib/kafka/data"
"""The broker's ``log.dirs`` inside the container (a named volume)."""
CONTAINER_LABEL = "org.kafka-changelog.test-broker"
NODE_ID = 1
HEAP_OPTS = "-Xmx512m -Xms128m"


def default_image() -> str:
    """``$KAFKA_CHANGELOG_KAFKA_IMAGE`` if set, else :data:`DEFAULT_IMAGE`."""
    return os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE


def default_engine() -> DockerEngine:
    """The engine of ``DOCKER_HOST``, or the default socket's."""
    return DockerEngine(os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}")


class ContainerKafkaCluster:
    """One combined broker+controller node in a Docker container on the host network.

    Args:
        image: the Kafka image (``apache/kafka`` conventions); default :func:`default_image`.
        broker_overrides: extra/overriding broker properties.
        startup_timeout: seconds until it must serve clients (start and restart).
        engine: the Docker engine; default ``DOCKER_HOST`` or the default socket.
    """

    def __init__(
        self,
        image: str | None = None,
        broker_overrides: Mapping[str, str] | None = None,
        startup_timeout: float = 120.0,
        engine: DockerEngine | None = None,
    ) -> None:
        self.image = image or default_image()
        self.broker_overrides = dict(broker_overrides or {})
        self.startup_timeout = startup_timeout
        self.engine = engine or default_engine()
        suffix = uuid.uuid4().hex[:10]
        self.name = f"kafka-changelog-broker-{suffix}"
        self.volume = f"kafka-changelog-data-{suffix}"
        self._node: NodeSpec | None = None
        self._environment: dict[str, str] = {}
        self._running = False

    def __repr__(self) -> str:
        address = self._node.client_address if self._node else None
        return f"ContainerKafkaCluster(image={self.image}, name={self.name}, bootstrap={address})"

    def __enter__(self) -> ContainerKafkaCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def node(self) -> NodeSpec:
        """Where the broker listens (host network: 127.0.0.1)."""
        if self._node is None:
            raise KafkaHarnessError(f"{self!r} is not started")
        return self._node

    @property
    def cluster_spec(self) -> ClusterSpec:
        """The cluster's settings, as the local-process cluster's are made."""
        return ClusterSpec((self.node,), overrides=self.broker_overrides, static_quorum=True)

    @property
    def environment(self) -> dict[str, str]:
        """The ``KAFKA_*`` (and ``CLUSTER_ID``) variables the container runs with."""
        return dict(self._environment)

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:port`` of the broker."""
        return self.node.client_address

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings to connect."""
        return {"bootstrap.servers": self.bootstrap_servers}

    def admin_client(self) -> AdminClient:
        """A new AdminClient for this cluster."""
        return AdminClient(self.client_config())

    def start(self) -> ContainerKafkaCluster:
        """Run the container and wait until it acknowledges an ``acks=all`` produce.

        Raises:
            DockerUnavailableError: no Docker engine answers, or it cannot run the image.
            BrokerStartError: the broker died or was not ready in time.
        """
        if self._node is not None:
            raise KafkaHarnessError(f"{self!r} is already started")
        client_port, controller_port = free_ports(2)
        self._node = NodeSpec(
            node_id=NODE_ID, client_port=client_port, controller_port=controller_port,
            log_dir=DATA_DIR, bind_host=LOOPBACK, controller_host=LOOPBACK,
        )
        self._environment = docker_environment(broker_properties(self._node, self.cluster_spec))
        self._environment["CLUSTER_ID"] = new_cluster_id()
        self._environment["KAFKA_HEAP_OPTS"] = HEAP_OPTS
        try:
            self.engine.docker("volume", "create", "--label", CONTAINER_LABEL, self.volume)
            env_args = [arg for key, value in self._environment.items()
                        for arg in ("-e", f"{key}={value}")]
            self.engine.docker(
                "run", "-d", "--name", self.name, "--network", "host",
                "--label", CONTAINER_LABEL, "-v", f"{self.volume}:{DATA_DIR}",
                *env_args, self.image,
            )
            self._running = True
            self._await_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Remove the container and its data volume. Idempotent."""
        if self._node is None:
            return
        self._node = None
        self._running = False
        self.engine.docker("rm", "-f", "-v", self.name, check=False)
        self.engine.docker("volume", "rm", "-f", self.volume, check=False)

    def kill(self) -> None:
        """``docker kill``: SIGKILL the broker; its data stays for :meth:`restart`."""
        self.engine.docker("kill", self.name)
        self.engine.docker("wait", self.name, timeout=60)
        self._running = False

    def restart(self) -> None:
        """Start the killed or stopped container again (same ports and data) and wait for it.

        Raises:
            BrokerStartError: it did not serve clients within ``startup_timeout``.
        """
        self.engine.docker("start", self.name)
        self._running = True
        self._await_ready()

    def pause(self) -> None:
        """``docker pause``: freeze every process of the broker (connections stay open)."""
        self.engine.docker("pause", self.name)

    def unpause(self) -> None:
        """``docker unpause``: let a paused broker go on."""
        self.engine.docker("unpause", self.name)

    def status(self) -> str:
        """The container's state (``running``, ``paused``, ``exited``...)."""
        result = self.engine.docker("inspect", "--format", "{{.State.Status}}", self.name)
        return result.stdout.strip()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the container's output (diagnostics)."""
        result = self.engine.docker("logs", "--tail", str(lines), self.name, check=False)
        return (result.stdout + result.stderr).strip() or "(no container logs)"

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        try:
            admin = AdminClient(quiet(self.client_config()))
            wait_for_brokers(admin, [NODE_ID], deadline, self._check_alive)
            produce_round_trip(admin, self.client_config(), 1, deadline, self._check_alive)
        except ProbeTimeout as exc:
            raise BrokerStartError(f"{self!r} was not ready: {exc}",
                                   log_tail=self.log_tail()) from exc

    def _check_alive(self) -> None:
        try:
            status = self.status()
        except DockerUnavailableError as exc:
            raise BrokerStartError(f"the Kafka container {self.name} is gone: {exc}") from exc
        if status in ("exited", "dead"):
            code = self.engine.docker("inspect", "--format", "{{.State.ExitCode}}", self.name,
                                      check=False).stdout.strip()
            raise BrokerStartError(
                f"the Kafka container {self.name} ({self.image}) exited",
                exit_code=int(code) if code.lstrip("-").isdigit() else None,
                log_tail=self.log_tail(),
            )
