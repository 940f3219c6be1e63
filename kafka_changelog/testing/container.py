"""The official ``apache/kafka`` image as a single-node test cluster, via testcontainers.

For machines with a Docker engine; the local-JVM cluster in
:mod:`kafka_changelog.local_kafka.broker` needs none. The broker settings are the
same (:func:`~kafka_changelog.local_kafka.config.broker_properties`), handed to the
image as ``KAFKA_*`` environment variables.
"""

from __future__ import annotations

import importlib
import time
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
    ToolMissingError,
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

DEFAULT_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
_CLIENT_PORT = 9092  # inside the container
_CONTROLLER_PORT = 9093
_DATA_DIR = "/tmp/kraft-combined-logs"


class ContainerKafkaCluster:
    """One combined broker+controller node in a Docker container.

    Args:
        image: the Kafka image to run.
        broker_overrides: extra/overriding broker properties.
        startup_timeout: seconds (including the image pull) until it must serve clients.
    """

    def __init__(
        self,
        image: str = DEFAULT_IMAGE,
        broker_overrides: dict[str, str] | None = None,
        startup_timeout: float = 180.0,
    ) -> None:
        self.image = image
        self.broker_overrides = dict(broker_overrides or {})
        self.startup_timeout = startup_timeout
        self._container: Any = None
        self._bootstrap: str | None = None

    def __repr__(self) -> str:
        return f"ContainerKafkaCluster(image={self.image}, bootstrap={self._bootstrap})"

    def __enter__(self) -> ContainerKafkaCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of the container's published client port."""
        if self._bootstrap is None:
            raise KafkaHarnessError(f"{self!r} is not started")
        return self._bootstrap

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings to connect."""
        return {"bootstrap.servers": self.bootstrap_servers}

    def admin_client(self) -> AdminClient:
        """A new AdminClient for this cluster."""
        return AdminClient(self.client_config())

    def start(self) -> ContainerKafkaCluster:
        """Run the container and wait until it acknowledges an ``acks=all`` produce.

        Raises:
            ToolMissingError: testcontainers is not installed.
            DockerUnavailableError: no Docker engine answers.
            BrokerStartError: the broker died or was not ready in time.
        """
        if self._container is not None:
            raise KafkaHarnessError(f"{self!r} is already started")
        deadline = time.monotonic() + self.startup_timeout
        try:
            self._run_container()
            admin = AdminClient(quiet(self.client_config()))
            wait_for_brokers(admin, [1], deadline, self._check_alive)
            produce_round_trip(admin, self.client_config(), 1, deadline, self._check_alive)
        except ProbeTimeout as exc:
            tail = self._log_tail()
            self.stop()
            raise BrokerStartError(f"{self!r} was not ready: {exc}", log_tail=tail) from exc
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Remove the container. Idempotent."""
        container, self._container = self._container, None
        self._bootstrap = None
        if container is not None:
            container.stop()

    def _run_container(self) -> None:
        try:
            from testcontainers.core.container import DockerContainer

            # docker-py ships no type hints; take its base exception dynamically.
            docker_exception: type[Exception] = importlib.import_module(
                "docker.errors"
            ).DockerException
        except ImportError as exc:
            raise ToolMissingError(
                "ContainerKafkaCluster needs testcontainers: pip install 'kafka-changelog[test]'"
            ) from exc
        try:
            container = DockerContainer(self.image)
            host = container.get_docker_client().host()
        except docker_exception as exc:
            raise DockerUnavailableError(
                f"no Docker engine is reachable ({exc}); use the local JVM cluster "
                "(pytest --broker=local) instead"
            ) from exc
        host = LOOPBACK if host in ("localhost", "") else host
        host_port = free_ports(1)[0]  # publish on a fixed port so the broker can advertise it
        node = NodeSpec(
            node_id=1,
            client_port=_CLIENT_PORT,
            controller_port=_CONTROLLER_PORT,
            log_dir=_DATA_DIR,
            bind_host="0.0.0.0",
            controller_host="localhost",
            advertised_host=host,
            advertised_port=host_port,
        )
        spec = ClusterSpec((node,), overrides=self.broker_overrides, static_quorum=True)
        env = docker_environment(broker_properties(node, spec))
        env["CLUSTER_ID"] = new_cluster_id()
        for key, value in env.items():
            container.with_env(key, value)
        container.with_bind_ports(_CLIENT_PORT, host_port)
        self._container = container
        self._bootstrap = f"{host}:{host_port}"
        try:
            container.start()
        except docker_exception as exc:
            raise DockerUnavailableError(f"could not start {self.image}: {exc}") from exc

    def _check_alive(self) -> None:
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        if wrapped.status in ("exited", "dead"):
            raise BrokerStartError(
                f"the Kafka container ({self.image}) exited",
                exit_code=int(wrapped.attrs.get("State", {}).get("ExitCode", -1)),
                log_tail=self._log_tail(),
            )

    def _log_tail(self, lines: int = 40) -> str:
        try:
            stdout, stderr = self._container.get_logs()
        except Exception as exc:  # the container may be gone; the tail is only diagnostics
            return f"(no container logs: {exc})"
        text = (stdout + stderr).decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])
