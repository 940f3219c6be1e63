"""pytest fixtures that start and stop real Kafka brokers.

An opt-in pytest plugin (it is not loaded into every project that installs
``kafka-changelog``): enable it with ``pytest -p kafka_changelog.testing.pytest_plugin``,
``addopts`` in the pytest configuration, or ``pytest_plugins =
["kafka_changelog.testing.pytest_plugin"]`` in a root ``conftest.py``. Tests can then
request:

``kafka_cluster`` (session)
    A single-node cluster (:class:`~kafka_changelog.testing.cluster.KafkaCluster`):
    local JVM by default, a container of ``kafka_image`` with ``--broker=container``,
    or an already running cluster if ``KAFKA_BOOTSTRAP_SERVERS`` is set (extra
    client settings as JSON in ``KAFKA_CHANGELOG_CLIENT_CONFIG``).
``docker_engine`` (session)
    A :class:`~kafka_changelog.testing.docker_engine.DockerEngine` that answers:
    Docker is installed (``apt-get``, as root) and ``dockerd`` started if needed, and a
    ``dockerd`` started here is stopped when the session's last user ends.
``kafka_image`` (session)
    The Kafka image the container clusters run: ``--kafka-image`` (default
    ``$KAFKA_CHANGELOG_KAFKA_IMAGE`` or ``apache/kafka:<version>``); ``local`` builds the
    stand-in (:func:`~kafka_changelog.testing.images.ensure_kafka_image`).
``container_kafka_cluster`` (module)
    A :class:`~kafka_changelog.testing.container.ContainerKafkaCluster` of ``kafka_image``
    with fault control (``kill``/``restart``, ``pause``/``unpause``).
``kafka_cluster_3`` (module)
    A local three-node :class:`~kafka_changelog.local_kafka.broker.LocalKafkaCluster`
    (replication factor 3, ``min.insync.replicas=2``) with fault control.
``secure_kafka_cluster`` (module)
    A local single node with SASL/SCRAM-SHA-256 and ACLs; users are
    :data:`SECURE_USERS` (``admin`` is the super user).
``kafka_topic`` (function)
    Name of a fresh topic on ``kafka_cluster``, deleted afterwards. One partition
    unless parametrized indirectly with an int (partitions) or a dict
    (``partitions``, ``config``, ``replication_factor``).
``make_topic`` (function)
    Factory ``make_topic(partitions=1, config=None, *, replication_factor=None,
    cluster=None, prefix=None) -> str`` creating topics (on ``kafka_cluster``
    unless ``cluster`` is given) that are deleted after the test.

The local clusters run the Kafka release ``--kafka-version`` names (default
``$KAFKA_CHANGELOG_KAFKA_VERSION`` or the library's; the jars of any release come from Maven
Central): ``scripts/compat.sh`` runs the compatibility tests this way per broker version.

Tests using these fixtures get the ``broker`` marker, and ``three_nodes`` /
``security`` / ``container`` for the clusters of those names, so ``-m "not three_nodes"``
works.
A cluster that cannot start makes its tests *error*; nothing is skipped.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from kafka_changelog.local_kafka.broker import LocalKafkaCluster
    from kafka_changelog.testing.cluster import KafkaCluster
    from kafka_changelog.testing.container import ContainerKafkaCluster
    from kafka_changelog.testing.docker_engine import DockerEngine

SECURE_USERS: Mapping[str, str] = {
    "admin": "admin-secret",
    "alice": "alice-secret",
    "bob": "bob-secret",
}
"""Users (name -> password) of ``secure_kafka_cluster``; ``admin`` is the super user."""

_BROKER_FIXTURES = frozenset(
    {"kafka_cluster", "kafka_cluster_3", "secure_kafka_cluster", "kafka_topic", "make_topic",
     "container_kafka_cluster"}
)
_CONTAINER_FIXTURES = frozenset({"docker_engine", "kafka_image", "container_kafka_cluster"})
LOCAL_IMAGE = "local"
#: Environment variable: the local clusters' Kafka release (``--kafka-version`` wins).
KAFKA_VERSION_ENV = "KAFKA_CHANGELOG_KAFKA_VERSION"
"""``--kafka-image`` value that builds the image here (no registry needed)."""
_MARKERS = {
    "broker": "needs a real Kafka broker (started by the fixtures)",
    "three_nodes": "needs the three-node cluster (module scoped, started on demand)",
    "security": "needs a SASL/ACL-enabled broker",
    "container": "needs a Docker engine (installed and started by the fixtures as root)",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--broker=local|container``."""
    group = parser.getgroup("kafka-changelog", "Kafka test brokers")
    group.addoption(
        "--broker",
        choices=("local", "container"),
        default="local",
        help="how kafka_cluster runs Kafka: local JVM processes (default) or a Docker "
        "container of --kafka-image. KAFKA_BOOTSTRAP_SERVERS, if set, overrides both.",
    )
    group.addoption(
        "--kafka-image",
        default=None,
        help="the Kafka image of container clusters: default $KAFKA_CHANGELOG_KAFKA_IMAGE or "
        f"apache/kafka:<version>; '{LOCAL_IMAGE}' builds a stand-in here from Debian packages "
        "and the Kafka jars (no registry needed).",
    )


    group.addoption(
        "--kafka-version",
        default=None,
        help="the Apache Kafka release of the local clusters (kafka_cluster, kafka_cluster_3, "
        "secure_kafka_cluster): default $KAFKA_CHANGELOG_KAFKA_VERSION or the library's "
        "(kafka_changelog.local_kafka.jars.KAFKA_VERSION); its jars come from Maven Central.",
    )


def local_kafka_version(config: pytest.Config) -> str:
    """The Kafka release the local clusters of this test run start (``--kafka-version``)."""
    from kafka_changelog.local_kafka.jars import KAFKA_VERSION

    chosen = config.getoption("--kafka-version") or os.environ.get(KAFKA_VERSION_ENV)
    return str(chosen or KAFKA_VERSION)


def pytest_configure(config: pytest.Config) -> None:
    """Declare the markers the fixtures apply (harmless if the project declares them too)."""
    declared = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    for name, text in _MARKERS.items():
        if name not in declared:
            config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by the clusters they use, for ``-m`` selection."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & _BROKER_FIXTURES:
            item.add_marker(pytest.mark.broker)
        if "kafka_cluster_3" in used:
            item.add_marker(pytest.mark.three_nodes)
        if "secure_kafka_cluster" in used:
            item.add_marker(pytest.mark.security)
        if used & _CONTAINER_FIXTURES:
            item.add_marker(pytest.mark.container)


def _session_cluster(request: pytest.FixtureRequest) -> KafkaCluster:
    from kafka_changelog.testing.external import ExternalKafkaCluster

    external = ExternalKafkaCluster.from_env()
    if external is not None:
        return external
    if request.config.getoption("--broker") == "container":
        from kafka_changelog.testing.container import ContainerKafkaCluster

        return ContainerKafkaCluster(image=request.getfixturevalue("kafka_image"),
                                     engine=request.getfixturevalue("docker_engine"))
    from kafka_changelog.local_kafka.broker import LocalKafkaCluster

    return LocalKafkaCluster(nodes=1, kafka_version=local_kafka_version(request.config))


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    """A Docker engine that answers (installed and started if needed; see the module doc)."""
    from kafka_changelog.testing.docker_engine import acquire_engine

    engine = acquire_engine()
    try:
        yield engine
    finally:
        engine.release()


@pytest.fixture(scope="session")
def kafka_image(pytestconfig: pytest.Config, docker_engine: DockerEngine) -> str:
    """The image container clusters run (``--kafka-image``; ``local``: built here)."""
    from kafka_changelog.testing.container import default_image

    image: str = pytestconfig.getoption("--kafka-image") or default_image()
    if image == LOCAL_IMAGE:
        from kafka_changelog.testing.images import ensure_kafka_image

        return ensure_kafka_image(docker_engine)
    return image


@pytest.fixture(scope="module")
def container_kafka_cluster(
    docker_engine: DockerEngine, kafka_image: str
) -> Iterator[ContainerKafkaCluster]:
    """A started single-node container cluster of ``kafka_image``, shared by the module."""
    from kafka_changelog.testing.container import ContainerKafkaCluster

    with ContainerKafkaCluster(image=kafka_image, engine=docker_engine) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kafka_cluster(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    """A started single-node cluster shared by the whole session."""
    cluster = _session_cluster(request)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def kafka_cluster_3(request: pytest.FixtureRequest) -> Iterator[LocalKafkaCluster]:
    """A started local three-node cluster shared by the test module (always local JVMs)."""
    from kafka_changelog.local_kafka.broker import LocalKafkaCluster

    with LocalKafkaCluster(nodes=3, kafka_version=local_kafka_version(request.config)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def secure_kafka_cluster(request: pytest.FixtureRequest) -> Iterator[LocalKafkaCluster]:
    """A started local single node speaking SASL_SSL (SCRAM-SHA-256 over TLS, the brokers'
    certificate signed by the cluster's own authority: ``cluster.tls``) with ACLs (users:
    SECURE_USERS): what managed Kafka services speak."""
    from kafka_changelog.local_kafka.broker import LocalKafkaCluster
    from kafka_changelog.local_kafka.security import SecurityConfig, SecurityProtocol

    security = SecurityConfig(mechanism="SCRAM-SHA-256", users=dict(SECURE_USERS), admin="admin",
                              protocol=SecurityProtocol.SASL_SSL)
    with LocalKafkaCluster(nodes=1, security=security,
                           kafka_version=local_kafka_version(request.config)) as cluster:
        yield cluster


class TopicFactory:
    """Creates uniquely named topics and deletes them all in :meth:`cleanup`."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._created: list[tuple[KafkaCluster, str]] = []

    def __call__(
        self,
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        *,
        replication_factor: int | None = None,
        cluster: KafkaCluster | None = None,
        prefix: str | None = None,
    ) -> str:
        """Create a topic and return its name. ``cluster`` defaults to ``kafka_cluster``."""
        from kafka_changelog.local_kafka.topics import create_topic, unique_topic_name

        target: KafkaCluster = cluster or self._request.getfixturevalue("kafka_cluster")
        name = unique_topic_name(prefix or f"test-{self._request.node.name}")
        create_topic(
            target.admin_client(),
            name,
            partitions=partitions,
            replication_factor=replication_factor,
            config=config,
        )
        self._created.append((target, name))
        return name

    def cleanup(self) -> None:
        """Delete every topic created; a failure (e.g. the test broke the cluster) only warns."""
        from kafka_changelog.local_kafka.errors import KafkaHarnessError
        from kafka_changelog.local_kafka.topics import delete_topics

        created, self._created = self._created, []
        for cluster, name in created:
            try:
                delete_topics(cluster.admin_client(), [name], timeout=15)
            except (KafkaHarnessError, RuntimeError) as exc:
                warnings.warn(f"could not delete test topic {name!r}: {exc}", stacklevel=1)


@pytest.fixture
def make_topic(request: pytest.FixtureRequest) -> Iterator[TopicFactory]:
    """Factory for fresh topics (see :class:`TopicFactory`), deleted after the test."""
    factory = TopicFactory(request)
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture
def kafka_topic(request: pytest.FixtureRequest, kafka_cluster: KafkaCluster) -> Iterator[str]:
    """A fresh topic on ``kafka_cluster``; indirect param: partitions (int) or a dict."""
    param: Any = getattr(request, "param", None)
    options: dict[str, Any]
    if param is None:
        options = {}
    elif isinstance(param, int):
        options = {"partitions": param}
    elif isinstance(param, Mapping):
        unknown = set(param) - {"partitions", "config", "replication_factor"}
        if unknown:
            raise ValueError(f"unknown kafka_topic parameters {sorted(unknown)}")
        options = dict(param)
    else:
        raise TypeError(f"kafka_topic takes an int or a dict as parameter, not {param!r}")
    factory = TopicFactory(request)
    try:
        yield factory(cluster=kafka_cluster, **options)
    finally:
        factory.cleanup()
