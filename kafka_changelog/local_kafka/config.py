"""Broker settings of the local clusters: the single place they are decided.

:data:`COMMON_BROKER_SETTINGS` holds what every node of every local cluster
shares (a docker-compose file for the same setup should match it);
:func:`broker_properties` adds the per-node, per-cluster-size and security parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from kafka_changelog.local_kafka.security import SecurityConfig
from kafka_changelog.local_kafka.tls import TlsFiles

CONTROLLER_LISTENER = "CONTROLLER"
PLAIN_LISTENER = "PLAINTEXT"

COMMON_BROKER_SETTINGS: Final[dict[str, str]] = {
    # Every node is broker and controller at once (KRaft combined mode).
    "process.roles": "broker,controller",
    "controller.listener.names": CONTROLLER_LISTENER,
    # Consumers in tests join a group alone; do not wait 3 s for company.
    "group.initial.rebalance.delay.ms": "0",
    # Code under test must create its topics (with their configs) explicitly.
    "auto.create.topics.enable": "false",
    # Fewer internal partitions: faster first group/transaction coordinator load.
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.num.partitions": "5",
    "share.coordinator.state.topic.num.partitions": "5",
    # The controller appends a no-op record to the metadata log every 0.5 s by default, and
    # every node applies and publishes it: most of what an idle local node spends (~2
    # CPU-s a minute). Nothing here waits on it; every 10 s still shows a live quorum.
    "metadata.max.idle.interval.ms": "10000",
    # Never lose acknowledged data by electing an out-of-sync replica.
    "unclean.leader.election.enable": "false",
}


def liveness_settings(node_count: int) -> dict[str, str]:
    """How fast the controller fences a node that stopped heartbeating.

    Several nodes: within ~3 s instead of 9 s, so that a killed node's partitions move
    soon (fail-over stays short). One node has nowhere to move them: Kafka's defaults
    (a heartbeat every 2 s, fenced after 9 s), four times fewer heartbeats, and a node
    that a loaded machine stalls for a few seconds is not fenced by its own controller.
    """
    if node_count > 1:
        return {"broker.heartbeat.interval.ms": "500", "broker.session.timeout.ms": "3000"}
    return {"broker.heartbeat.interval.ms": "2000", "broker.session.timeout.ms": "9000"}


def replication_settings(node_count: int) -> dict[str, str]:
    """Replication defaults for a cluster of ``node_count`` nodes.

    One node: everything at replication factor 1. Three or more: factor 3 with
    ``min.insync.replicas=2``, so an ``acks=all`` write survives losing one node.
    """
    if node_count < 1:
        raise ValueError(f"a cluster needs at least one node, not {node_count}")
    factor = min(node_count, 3)
    min_isr = max(1, factor - 1)
    return {
        "default.replication.factor": str(factor),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(factor),
        "transaction.state.log.replication.factor": str(factor),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(factor),
        "share.coordinator.state.topic.min.isr": str(min_isr),
    }


@dataclass(frozen=True)
class NodeSpec:
    """Where one node listens and stores its data.

    ``bind_host`` is the listeners' address; clients are told
    ``advertised_host:advertised_port`` (default: ``bind_host:client_port``),
    and the controllers reach each other at ``controller_host:controller_port``.
    """

    node_id: int
    client_port: int
    controller_port: int
    log_dir: str
    bind_host: str = "127.0.0.1"
    controller_host: str = "127.0.0.1"
    advertised_host: str | None = None
    advertised_port: int | None = None

    @property
    def client_address(self) -> str:
        """``host:port`` clients connect to."""
        host = self.advertised_host or self.bind_host
        return f"{host}:{self.advertised_port or self.client_port}"

    @property
    def controller_address(self) -> str:
        """``host:port`` of this node's controller listener."""
        return f"{self.controller_host}:{self.controller_port}"


@dataclass(frozen=True)
class ClusterSpec:
    """The whole cluster: its nodes, optional security and per-test overrides.

    ``static_quorum`` picks ``controller.quorum.voters`` (formatted without
    ``--standalone``); otherwise a single node uses a dynamic quorum through
    ``controller.quorum.bootstrap.servers`` (formatted with ``--standalone``).
    """

    nodes: tuple[NodeSpec, ...]
    security: SecurityConfig | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)
    static_quorum: bool | None = None  # None: static for more than one node
    #: The certificates of a TLS listener (security with a TLS protocol).
    tls: TlsFiles | None = None

    @property
    def uses_static_quorum(self) -> bool:
        """Whether the controller quorum is a fixed voter list."""
        return len(self.nodes) > 1 if self.static_quorum is None else self.static_quorum

    @property
    def client_listener(self) -> str:
        """Listener name (= security protocol) clients and other brokers use."""
        return self.security.listener if self.security else PLAIN_LISTENER

    @property
    def bootstrap_servers(self) -> str:
        """Comma-separated client addresses of all nodes."""
        return ",".join(node.client_address for node in self.nodes)


def broker_properties(node: NodeSpec, cluster: ClusterSpec) -> dict[str, str]:
    """All ``server.properties`` entries of ``node`` in ``cluster``.

    Order of precedence (later wins): common settings, liveness and replication defaults,
    node addresses, security, then ``cluster.overrides``.
    """
    if len(cluster.nodes) > 1 and not cluster.uses_static_quorum:
        raise ValueError("a multi-node test cluster needs a static controller quorum")
    listener = cluster.client_listener
    props = dict(COMMON_BROKER_SETTINGS)
    props |= liveness_settings(len(cluster.nodes))
    props |= replication_settings(len(cluster.nodes))
    props |= {
        "node.id": str(node.node_id),
        "listeners": (
            f"{listener}://{node.bind_host}:{node.client_port},"
            f"{CONTROLLER_LISTENER}://{node.bind_host}:{node.controller_port}"
        ),
        "advertised.listeners": f"{listener}://{node.client_address}",
        "listener.security.protocol.map": (
            f"{listener}:{listener},{CONTROLLER_LISTENER}:{PLAIN_LISTENER}"
        ),
        "inter.broker.listener.name": listener,
        "log.dirs": node.log_dir,
    }
    if cluster.uses_static_quorum:
        props["controller.quorum.voters"] = ",".join(
            f"{n.node_id}@{n.controller_address}" for n in cluster.nodes
        )
    else:
        props["controller.quorum.bootstrap.servers"] = node.controller_address
    if cluster.security is not None:
        props |= cluster.security.broker_settings(cluster.tls)
    props |= dict(cluster.overrides)
    return props


def render_properties(props: Mapping[str, str]) -> str:
    """Serialise ``props`` in Java ``.properties`` syntax (read by Kafka as ISO-8859-1)."""
    return "".join(f"{_escape(k, is_key=True)}={_escape(v)}\n" for k, v in props.items())


def _escape(text: str, *, is_key: bool = False) -> str:
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif is_key and char in "=: #!":
            out.append("\\" + char)
        elif ord(char) > 0x7E:
            # Properties files are Latin-1 on the Java side: escape as UTF-16 code units.
            units = char.encode("utf-16-be")
            out.extend(
                f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2)
            )
        else:
            out.append(char)
    return "".join(out)


def docker_environment(props: Mapping[str, str]) -> dict[str, str]:
    """``props`` as the ``KAFKA_*`` environment variables of the ``apache/kafka`` image.

    The image maps ``.`` to ``_``, ``_`` to ``__`` and ``-`` to ``___``.
    """
    env = {}
    for key, value in props.items():
        name = key.replace("_", "__").replace("-", "___").replace(".", "_").upper()
        env[f"KAFKA_{name}"] = value
    return env
