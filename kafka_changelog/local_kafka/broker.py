"""A real Apache Kafka cluster (KRaft, combined broker+controller nodes) as local JVMs.

Example::

    with LocalKafkaCluster(nodes=3) as cluster:
        producer = Producer({**cluster.client_config(), "acks": "all"})
        ...
        cluster.kill_node(cluster.leader_of("orders", 0))

Nodes are addressed by *index* (0 .. nodes-1); node index ``i`` has Kafka
``node.id`` ``i + 1``.

Why this module is over the library's 600 lines: one class owns the nodes' life cycle
(configs, start, wait until usable, kill, pause, restart, stop) and the questions tests
ask of a running cluster (leaders, controller); the pieces without cluster state are
modules of their own (``jvm``, ``process``, ``config``, ``security``, ``acls``, ``probe``,
``topics``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AclBinding, AdminClient, ResourcePatternType, ResourceType

from kafka_changelog.local_kafka import acls, class_archive, process
from kafka_changelog.local_kafka.config import (
    ClusterSpec,
    NodeSpec,
    broker_properties,
    render_properties,
)
from kafka_changelog.local_kafka.errors import BrokerStartError, KafkaHarnessError
from kafka_changelog.local_kafka.jars import KAFKA_VERSION, ensure_kafka_jars
from kafka_changelog.local_kafka.jvm import (
    FAST_START_FLAGS,
    find_java,
    format_command,
    new_cluster_id,
    server_command,
)
from kafka_changelog.local_kafka.net import LOOPBACK, free_ports, port_open
from kafka_changelog.local_kafka.probe import (
    ProbeTimeout,
    produce_round_trip,
    quiet,
    wait_for_brokers,
    wait_for_isr,
)
from kafka_changelog.local_kafka.security import SecurityConfig
from kafka_changelog.local_kafka.tls import TlsFiles
from kafka_changelog.local_kafka.workdir import make_cluster_root, release_cluster_root

__all__ = ["BrokerStartError", "LocalKafkaCluster", "SecurityConfig"]

KEEP_DIR_ENV = "KAFKA_CHANGELOG_KEEP_CLUSTER_DIR"
"""Set to 1 to keep a cluster's directory (data and logs) after ``stop()``, for debugging."""

LOG_TAIL_LINES = 40

#: File in a kept data directory recording what must stay the same across restarts.
LAYOUT_FILE = "cluster.json"


@dataclass
class _Node:
    """Runtime state of one node."""

    index: int
    spec: NodeSpec
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def properties_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def server_log(self) -> Path:
        return self.directory / "server.log"

    @property
    def output_log(self) -> Path:
        return self.directory / "stdout.log"


def _tail(path: Path, lines: int) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return list(deque(handle, maxlen=lines))
    except OSError:
        return []


class LocalKafkaCluster:
    """Apache Kafka 4.x in KRaft mode, every node a combined broker+controller JVM.

    Args:
        nodes: number of nodes; 1 (replication factor 1) or 3 (replication
            factor 3, ``min.insync.replicas=2``).
        security: SASL on the client listener plus ACLs, or None for PLAINTEXT.
        broker_overrides: extra/overriding ``server.properties`` entries for every
            node, e.g. ``{"log.segment.bytes": "65536", "log.cleaner.backoff.ms": "100"}``.
        startup_timeout: seconds for start (and for each ``restart_node``) until
            the cluster answers metadata and acknowledges an ``acks=all`` produce.
        kafka_version: which Kafka release's jars to run.
        heap: JVM ``-Xmx`` of each node.
        client_port: the client port of node 0 (node ``i`` listens on
            ``client_port + i``); None picks free ports.
        data_dir: a directory that keeps the nodes' data and logs across
            ``stop()`` and the next ``start()`` (formatted on first use, reused
            afterwards with the same controller ports); None: a temporary one.
        advertised_host: the host name clients are told (default: the loopback
            address the listeners bind, 127.0.0.1).
        tls_hosts: with a TLS protocol, the names and addresses the brokers'
            certificate is valid for (default: 127.0.0.1, localhost and the
            advertised host); leave one out to see a hostname mismatch.
        class_archive: map a class-data-sharing archive of the release's classes
            (:mod:`.class_archive`; made by the first start on a machine, ~15 s once):
            every node then starts with about 1.5 CPU-s less.

    ``stop()`` kills the nodes and deletes all their data (unless ``data_dir``
    keeps it); it also runs when ``start()`` fails, and at interpreter exit for
    clusters never stopped. :meth:`shutdown` stops the nodes gracefully first.
    """

    def __init__(
        self,
        nodes: int = 1,
        security: SecurityConfig | None = None,
        broker_overrides: dict[str, str] | None = None,
        startup_timeout: float = 90.0,
        *,
        kafka_version: str = KAFKA_VERSION,
        heap: str = "512m",
        client_port: int | None = None,
        data_dir: Path | str | None = None,
        advertised_host: str | None = None,
        tls_hosts: Sequence[str] | None = None,
        class_archive: bool = True,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, not {nodes}")
        if client_port is not None and not 0 < client_port <= 65536 - nodes:
            raise ValueError(f"client port {client_port} leaves no room for {nodes} node(s)")
        self.node_count = nodes
        self.security = security
        self.broker_overrides = dict(broker_overrides or {})
        self.startup_timeout = startup_timeout
        self.kafka_version = kafka_version
        self.heap = heap
        self.client_port = client_port
        self.data_dir = Path(data_dir).resolve() if data_dir is not None else None
        self.advertised_host = advertised_host
        self.tls_hosts = tuple(tls_hosts) if tls_hosts is not None else None
        self.class_archive = class_archive
        #: JVM options of every node and formatter (the class archive's), and of the nodes
        #: only (the one writing the archive).
        self._jvm_options: list[str] = []
        self._server_options: list[str] = []
        self._spec: ClusterSpec | None = None
        self._tls: TlsFiles | None = None
        self._nodes: list[_Node] = []
        self._root: Path | None = None
        self._admin: AdminClient | None = None
        self._java = ""
        self._jars = Path()
        self._log_config = Path()

    # -- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> LocalKafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"bootstrap={self._spec.bootstrap_servers}" if self._spec else "stopped"
        secured = ", secured" if self.security else ""
        return f"LocalKafkaCluster(nodes={self.node_count}{secured}, {state})"

    def start(self) -> LocalKafkaCluster:
        """Format and launch all nodes, then wait until the cluster serves clients.

        Raises:
            BrokerStartError: a node died or the cluster was not ready within
                ``startup_timeout`` (the message carries exit code and log tail).
            ToolMissingError / JarsUnavailableError: no Java, no Maven, no jars.
        """
        if self._nodes:
            raise KafkaHarnessError(f"{self!r} is already started")
        try:
            self._java = find_java()
            self._jars = ensure_kafka_jars(self.kafka_version)
            self._jvm_options = self._class_archive_options()
            deadline = time.monotonic() + self.startup_timeout
            self._prepare_directories()
            self._format_storage(deadline)
            for node in self._nodes:
                self._launch(node)
            self._await_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _class_archive_options(self) -> list[str]:
        if not self.class_archive:
            return []
        archive = class_archive.archive_path(self._java, self._jars, FAST_START_FLAGS)
        if class_archive.ensure_archive(archive, self._java,
                                        self._run_node_for_class_archive):
            return class_archive.use_options(archive)
        return []

    def _run_node_for_class_archive(self, jvm_options: list[str]) -> None:
        node = LocalKafkaCluster(kafka_version=self.kafka_version, class_archive=False,
                                 startup_timeout=self.startup_timeout)
        node._server_options = jvm_options
        with node:
            class_archive.exercise(node.bootstrap_servers)
            node.shutdown()  # a graceful exit writes the archive

    def shutdown(self, timeout: float = 60.0) -> None:
        """Stop every node gracefully at once (SIGTERM; SIGKILL after ``timeout``), then
        :meth:`stop`. A kept ``data_dir`` then needs no log recovery at the next start."""
        running = [n.process for n in self._nodes if n.process is not None]
        for proc in running:
            if process.signal_group(proc, signal.SIGTERM):
                process.signal_group(proc, signal.SIGCONT)  # a paused JVM cannot handle it
        deadline = time.monotonic() + timeout
        for proc in running:
            # Nodes stop in parallel; each waits for what is left of the common deadline.
            process.terminate(proc, max(0.1, deadline - time.monotonic()))
        for node in self._nodes:
            node.process, node.paused = None, False
        self.stop()

    def stop(self) -> None:
        """Kill every node and delete the cluster's directory (a kept ``data_dir`` stays).
        Idempotent."""
        admin, self._admin = self._admin, None
        del admin  # release librdkafka threads before the brokers vanish
        for node in self._nodes:
            if node.process is not None:
                process.kill(node.process)
        self._nodes = []
        self._spec = None
        self._tls = None
        root, self._root = self._root, None
        if root is not None and root == self.data_dir:
            return  # kept for the next start
        if root is not None:
            process.untrack_directory(root)
            if os.environ.get(KEEP_DIR_ENV) == "1":
                release_cluster_root(root)  # so later runs do not sweep it away
            else:
                shutil.rmtree(root, ignore_errors=True)

    # -- connection ----------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of every node's client listener, comma-separated."""
        return self._cluster_spec().bootstrap_servers

    def client_config(self, user: str | None = None, password: str | None = None) -> dict[str, Any]:
        """librdkafka settings to connect; with security, as ``user`` (default: the admin).

        ``password`` defaults to the user's password in :attr:`security`; pass
        a wrong one to test authentication failures.
        """
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        if self.security is not None:
            config |= self.security.client_settings(user, password, self._tls)
        elif user is not None or password is not None:
            raise ValueError(f"{self!r} has no security; it takes no user or password")
        return config

    @property
    def tls(self) -> TlsFiles:
        """The certificates of a TLS-secured cluster (its authority, the brokers' and a
        client certificate per user), made when it started."""
        if self._tls is None:
            raise KafkaHarnessError(f"{self!r} was not started with a TLS protocol")
        return self._tls

    def admin_client(self, user: str | None = None, password: str | None = None) -> AdminClient:
        """A new AdminClient (as the admin user when security is on)."""
        return AdminClient(self.client_config(user, password))

    # -- nodes ---------------------------------------------------------------------

    @property
    def root_dir(self) -> Path:
        """The cluster's temporary directory (one ``node-<id>`` folder per node)."""
        if self._root is None:
            raise KafkaHarnessError(f"{self!r} is not started")
        return self._root

    def node_id(self, index: int) -> int:
        """Kafka ``node.id`` of node ``index``."""
        return self._node(index).spec.node_id

    def index_of(self, node_id: int) -> int:
        """Node index of Kafka ``node.id`` ``node_id``."""
        for node in self._nodes:
            if node.spec.node_id == node_id:
                return node.index
        raise KafkaHarnessError(f"no node with node.id {node_id} in {self!r}")

    def pid(self, index: int) -> int | None:
        """Process id of node ``index``'s JVM, or None while it is stopped."""
        proc = self._node(index).process
        return proc.pid if proc is not None and proc.poll() is None else None

    def pids(self) -> list[int]:
        """Process ids of all running node JVMs."""
        return [pid for pid in (self.pid(n.index) for n in self._nodes) if pid is not None]

    def is_running(self, index: int) -> bool:
        """True if node ``index``'s JVM is alive (paused counts as alive)."""
        return self.pid(index) is not None

    def log_path(self, index: int) -> Path:
        """The broker log (``server.log``) of node ``index``."""
        return self._node(index).server_log

    def log_tail(self, index: int, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of node ``index``'s log (plus any JVM console output)."""
        node = self._node(index)
        text = "".join(_tail(node.server_log, lines))
        console = "".join(_tail(node.output_log, 15)).strip()
        if console:
            text += f"--- JVM console ({node.output_log.name}) ---\n{console}\n"
        return text or f"(no log output in {node.directory})"

    def stop_node(self, index: int, timeout: float = 30.0) -> int:
        """Shut node ``index`` down gracefully (SIGTERM, wait; SIGKILL after ``timeout``).

        Returns its exit code. Its data and ports are kept for :meth:`restart_node`.
        """
        node = self._node(index)
        if node.process is None:
            raise KafkaHarnessError(f"node {index} of {self!r} is not running")
        code = process.terminate(node.process, timeout)
        node.process, node.paused = None, False
        return code

    def kill_node(self, index: int) -> int:
        """Kill node ``index`` with SIGKILL (a crash: no controlled shutdown). Returns exit code."""
        node = self._node(index)
        if node.process is None:
            raise KafkaHarnessError(f"node {index} of {self!r} is not running")
        code = process.kill(node.process)
        node.process, node.paused = None, False
        return code

    def restart_node(self, index: int, timeout: float | None = None) -> None:
        """(Stop if running, then) start node ``index`` again with its data and ports.

        Returns once the node is a broker in the metadata again and back in the
        ISR of every partition it replicates, or raises :class:`BrokerStartError`
        after ``timeout`` (default ``startup_timeout``) seconds.
        """
        node = self._node(index)
        if node.process is not None:
            self.stop_node(index)
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        self._launch(node)
        try:
            wait_for_isr(self._internal_admin(), node.spec.node_id, deadline, self._check_alive)
        except ProbeTimeout as exc:
            raise BrokerStartError(
                f"node {index} did not rejoin {self!r}: {exc}",
                node=index,
                log_tail=self.log_tail(index),
            ) from exc

    def pause_node(self, index: int) -> None:
        """Freeze node ``index`` (SIGSTOP): it keeps its connections but answers nothing."""
        node = self._node(index)
        if node.process is None or not process.signal_group(node.process, signal.SIGSTOP):
            raise KafkaHarnessError(f"node {index} of {self!r} is not running")
        node.paused = True

    def resume_node(self, index: int) -> None:
        """Let a paused node ``index`` run again (SIGCONT)."""
        node = self._node(index)
        if node.process is None or not process.signal_group(node.process, signal.SIGCONT):
            raise KafkaHarnessError(f"node {index} of {self!r} is not running")
        node.paused = False

    def leader_of(self, topic: str, partition: int = 0) -> int:
        """Node index of the current leader of ``topic``/``partition`` (fresh metadata)."""
        try:
            meta = self._internal_admin().list_topics(topic, timeout=10)
        except KafkaException as exc:
            raise KafkaHarnessError(f"no metadata for topic {topic!r}: {exc.args[0]}") from exc
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            reason = "unknown topic" if found is None else found.error
            raise KafkaHarnessError(f"no metadata for topic {topic!r}: {reason}")
        part = found.partitions.get(partition)
        if part is None:
            raise KafkaHarnessError(f"topic {topic!r} has no partition {partition}")
        if part.leader < 0:
            raise KafkaHarnessError(f"{topic}/{partition} has no leader right now")
        return self.index_of(part.leader)

    # -- ACLs ----------------------------------------------------------------------

    def grant(
        self,
        principal: str,
        resource_type: ResourceType | str,
        name: str,
        operations: acls.Operations,
        *,
        pattern_type: ResourcePatternType | str = ResourcePatternType.LITERAL,
    ) -> list[AclBinding]:
        """Allow ``principal`` (``"alice"`` or ``"User:alice"``) ``operations`` on a resource.

        Example: ``cluster.grant("alice", "TOPIC", "orders", ["READ", "DESCRIBE"])``.
        """
        self._require_security("grant")
        return acls.grant(
            self._internal_admin(),
            principal,
            resource_type,
            name,
            operations,
            pattern_type=pattern_type,
        )

    def revoke(
        self,
        principal: str,
        resource_type: ResourceType | str,
        name: str,
        operations: acls.Operations,
        *,
        pattern_type: ResourcePatternType | str = ResourcePatternType.LITERAL,
    ) -> None:
        """Remove ACLs created by :meth:`grant` with the same arguments."""
        self._require_security("revoke")
        acls.revoke(
            self._internal_admin(),
            principal,
            resource_type,
            name,
            operations,
            pattern_type=pattern_type,
        )

    # -- internals -----------------------------------------------------------------

    def _require_security(self, what: str) -> None:
        if self.security is None:
            raise KafkaHarnessError(
                f"{what}() needs a cluster started with security=SecurityConfig(...)"
            )

    def _cluster_spec(self) -> ClusterSpec:
        if self._spec is None:
            raise KafkaHarnessError(f"{self!r} is not started")
        return self._spec

    def _node(self, index: int) -> _Node:
        if not self._nodes:
            raise KafkaHarnessError(f"{self!r} is not started")
        if not 0 <= index < len(self._nodes):
            raise IndexError(f"node index {index} out of range 0..{len(self._nodes) - 1}")
        return self._nodes[index]

    def _internal_admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(quiet(self.client_config()))
        return self._admin

    def _prepare_directories(self) -> None:
        """Create the cluster dir, pick ports and write every node's server.properties."""
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._root = root = self.data_dir
        else:
            self._root = root = make_cluster_root()
            process.track_directory(root)
        self._log_config = root / "log4j2.properties"
        self._log_config.write_text(
            resources.files(__package__).joinpath("log4j2.properties").read_text("utf-8"),
            "utf-8",
        )
        client_ports, controller_ports = self._pick_ports()
        specs = tuple(
            NodeSpec(
                node_id=i + 1,
                client_port=client_ports[i],
                controller_port=controller_ports[i],
                log_dir=str(root / f"node-{i + 1}" / "data"),
                advertised_host=self.advertised_host,
            )
            for i in range(self.node_count)
        )
        if self.security is not None and self.security.protocol.uses_tls:
            hosts = self.tls_hosts or (LOOPBACK, "localhost",
                                       *([self.advertised_host] if self.advertised_host
                                         else []))
            self._tls = TlsFiles.create(root / "tls", self.security.users, hosts)
        self._spec = ClusterSpec(specs, self.security, self.broker_overrides, tls=self._tls)
        for i, spec in enumerate(specs):
            node = _Node(i, spec, root / f"node-{spec.node_id}")
            Path(spec.log_dir).mkdir(parents=True, exist_ok=self.data_dir is not None)
            node.properties_file.write_text(
                render_properties(broker_properties(spec, self._spec)), "latin-1"
            )
            self._nodes.append(node)

    def _pick_ports(self) -> tuple[list[int], list[int]]:
        """Client and controller ports of every node.

        Client ports are fixed (``client_port``) or free ones. Controller ports are
        free ones, except in a kept ``data_dir`` that was formatted before: the
        controller quorum remembers its endpoints, so they are reused from there.
        """
        count = self.node_count
        if self.client_port is not None:
            clients = [self.client_port + i for i in range(count)]
            taken = [p for p in clients if port_open(LOOPBACK, p)]
            if taken:
                raise BrokerStartError(
                    f"port {taken[0]} on {LOOPBACK} is in use (another Kafka?); pick another "
                    "client port")
        else:
            clients = []
        layout = self._read_layout()
        if layout is not None:
            controllers = [int(p) for p in layout["controller_ports"]]
        else:
            picked = [p for p in free_ports(3 * count, LOOPBACK) if p not in clients]
            controllers = picked[:count]
            if not clients:
                clients = picked[count:2 * count]
            self._write_layout({"nodes": count, "controller_ports": controllers})
        return clients, controllers

    def _read_layout(self) -> dict[str, Any] | None:
        """What a kept ``data_dir`` was formatted with (None: not formatted there yet)."""
        if self.data_dir is None:
            return None
        path = self.data_dir / LAYOUT_FILE
        if not path.exists():
            return None
        layout: dict[str, Any] = json.loads(path.read_text("utf-8"))
        if layout.get("nodes") != self.node_count:
            raise KafkaHarnessError(
                f"data directory {self.data_dir} holds a cluster of {layout.get('nodes')} "
                f"node(s), not {self.node_count}; use another directory or the same node count")
        return layout

    def _write_layout(self, layout: dict[str, Any]) -> None:
        if self.data_dir is not None:
            (self.data_dir / LAYOUT_FILE).write_text(json.dumps(layout) + "\n", "utf-8")

    def _format_storage(self, deadline: float) -> None:
        """Run ``StorageTool format`` for all nodes at once (same cluster id) and check them.

        Nodes of a kept ``data_dir`` that are formatted already are left as they are.
        """
        spec = self._cluster_spec()
        formatted = [(Path(n.spec.log_dir) / "meta.properties").exists() for n in self._nodes]
        if all(formatted):
            return
        if any(formatted):
            raise KafkaHarnessError(
                f"data directory {self.data_dir} has nodes with and without Kafka data "
                f"(formatted: {formatted}); use a fresh directory")
        cluster_id = new_cluster_id()
        scram = self.security.scram_format_arguments() if self.security else []
        running = []
        for node in self._nodes:
            argv = format_command(
                self._java,
                self._jars,
                node.properties_file,
                cluster_id=cluster_id,
                standalone=not spec.uses_static_quorum,
                scram_credentials=scram,
                log_config=self._log_config,
                log_dir=node.directory,
                jvm_options=self._jvm_options,
            )
            output = node.directory / "format.log"
            running.append((node, output, process.spawn(argv, output=output, cwd=node.directory)))
        try:
            for node, output, proc in running:
                try:
                    code = proc.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    code = process.kill(proc)
                if code != 0:
                    raise BrokerStartError(
                        f"formatting the storage of node {node.index} failed",
                        node=node.index,
                        exit_code=code,
                        log_tail="".join(_tail(output, LOG_TAIL_LINES)),
                    )
        finally:
            for _, _, proc in running:
                process.kill(proc)  # reaps and unregisters it (no signal if it has exited)

    def _launch(self, node: _Node) -> None:
        argv = server_command(
            self._java,
            self._jars,
            node.properties_file,
            log_config=self._log_config,
            log_dir=node.directory,
            heap=self.heap,
            jvm_options=[*self._jvm_options, *self._server_options],
        )
        node.process = process.spawn(argv, output=node.output_log, cwd=node.directory)
        node.paused = False

    def _check_alive(self) -> None:
        """Raise :class:`BrokerStartError` if a node that should run has exited."""
        for node in self._nodes:
            if node.process is not None and node.process.poll() is not None:
                code = node.process.returncode
                node.process = None
                raise BrokerStartError(
                    f"node {node.index} (node.id {node.spec.node_id}) of {self!r} exited",
                    node=node.index,
                    exit_code=code,
                    log_tail=self.log_tail(node.index),
                )

    def _await_ready(self, deadline: float) -> None:
        admin = self._internal_admin()
        node_ids = [node.spec.node_id for node in self._nodes]
        try:
            wait_for_brokers(admin, node_ids, deadline, self._check_alive)
            produce_round_trip(
                admin, self.client_config(), min(self.node_count, 3), deadline, self._check_alive
            )
        except ProbeTimeout as exc:
            tails = "\n".join(
                f"=== node {n.index} (node.id {n.spec.node_id}) ===\n{self.log_tail(n.index)}"
                for n in self._nodes
            )
            raise BrokerStartError(
                f"{self!r} was not ready within {self.startup_timeout:.0f} s: {exc}", log_tail=tails
            ) from exc
