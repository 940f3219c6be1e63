"""``kafka-changelog broker``: the project's local Apache Kafka, in the foreground.

The local Kafka the tests use too (:class:`~kafka_changelog.local_kafka.broker.LocalKafkaCluster`:
KRaft, combined broker/controller JVMs from Maven jars), on a fixed port, until
Ctrl-C (SIGINT) or SIGTERM stops it gracefully. Data lives in a temporary
directory deleted at exit, or in ``--data-dir``, kept across restarts.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from .options import CliError
from .output import progress

if TYPE_CHECKING:  # the local Kafka is imported only when the command runs
    from ..local_kafka.broker import LocalKafkaCluster

DEFAULT_PORT = 9092
#: The name clients are told: what the README's snippets connect to.
ADVERTISED_HOST = "localhost"
#: Seconds the nodes get to shut down gracefully before they are killed.
SHUTDOWN_TIMEOUT_S = 60.0


class _Stop(Exception):
    """SIGINT or SIGTERM arrived: stop the cluster."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def _broker_config(items: list[str] | None) -> dict[str, str]:
    overrides = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--broker-config expects key=value, got {item!r}")
        overrides[key] = value
    return overrides


def _run(args: argparse.Namespace) -> int:
    from ..local_kafka.broker import LocalKafkaCluster
    from ..local_kafka.errors import KafkaHarnessError

    data_dir: Path | None = args.data_dir
    # A broker to try things on creates the topics a snippet produces to (the test
    # harness does not, so that tests see missing topics); --broker-config overrides it.
    overrides = {"auto.create.topics.enable": "true", **_broker_config(args.broker_config)}
    cluster = LocalKafkaCluster(
        nodes=args.nodes, broker_overrides=overrides,
        startup_timeout=args.startup_timeout, client_port=args.port, data_dir=data_dir,
        advertised_host=ADVERTISED_HOST)
    nodes = f"{args.nodes} node{'s' if args.nodes > 1 else ''}"
    where = f"data in {data_dir} (kept)" if data_dir else "data deleted at exit"
    progress(f"starting Apache Kafka {cluster.kafka_version} (KRaft, {nodes}, {where}); the "
             "first start downloads the broker jars from Maven Central")
    # Installed before start: a signal during startup stops it too (the harness's own
    # SIGTERM hook, installed at its first launch, kills the JVMs and then calls this).
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            cluster.start()
        except KafkaHarnessError as exc:
            raise CliError(f"the broker did not start: {exc}") from exc
        # Replace the harness's SIGTERM hook (it kills the JVMs at once): stop gracefully.
        signal.signal(signal.SIGTERM, _on_signal)
        print(f"Kafka is up at {cluster.bootstrap_servers} (KRaft, {nodes}); Ctrl-C stops it",
              flush=True)
        return _wait(cluster)
    except _Stop as stop:
        return _shutdown(cluster, str(stop))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _wait(cluster: LocalKafkaCluster) -> int:
    """Until a signal (raising :class:`_Stop`) or a node's death (exit code 1)."""
    while True:
        time.sleep(0.5)
        dead = [i for i in range(cluster.node_count) if not cluster.is_running(i)]
        if dead:
            print(f"kafka-changelog: error: node {dead[0]} of the broker exited; its log:\n"
                  f"{cluster.log_tail(dead[0])}", file=sys.stderr)
            cluster.stop()
            return 1


def _shutdown(cluster: LocalKafkaCluster, reason: str) -> int:
    # A second Ctrl-C must not cut the graceful stop short (the JVMs die at exit anyway).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    progress(f"{reason}: stopping Kafka ...")
    cluster.shutdown(SHUTDOWN_TIMEOUT_S)
    progress("Kafka stopped")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``broker``."""
    text = ("run a local Apache Kafka (KRaft, the tests' harness) in the foreground until "
            "Ctrl-C")
    parser = commands.add_parser("broker", help=text, description=text)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"client port of the first node; node i listens on port + i "
                             f"(default {DEFAULT_PORT})")
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 3),
                        help="1 (replication factor 1) or 3 (replication factor 3, "
                             "min.insync.replicas=2); default 1")
    parser.add_argument("--data-dir", type=Path, metavar="DIR",
                        help="keep the data here across restarts (default: a temporary "
                             "directory deleted at exit)")
    parser.add_argument("--broker-config", action="append", metavar="KEY=VALUE",
                        help="extra server.properties entry for every node (repeatable; "
                             "topics are created on first use unless "
                             "auto.create.topics.enable=false)")
    parser.add_argument("--startup-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="seconds until the broker must serve clients (default 120)")
    parser.set_defaults(func=_run)
