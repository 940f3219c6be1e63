"""Options the commands share: brokers, librdkafka settings, topics, output, and the
client configs built from them.

Shared options are accepted before the command (``kafka-changelog -b host:9092
applications``) and after it (``kafka-changelog applications -b host:9092``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ..errors import ChangelogError
from ..kafka import KafkaChangelogConfig
from ..kafka.checkpoint_store import CheckpointStoreConfig
from ..kafka.snapshot_store import SnapshotStoreConfig

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


def _default_topic(config: type[Any]) -> str:
    # The library's own default, so the command line never drifts from it.
    defaults: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(config)}
    return str(defaults["topic"])


DEFAULT_CHANGELOG_TOPIC = _default_topic(KafkaChangelogConfig)
DEFAULT_SNAPSHOT_TOPIC = _default_topic(SnapshotStoreConfig)
DEFAULT_CHECKPOINT_TOPIC = _default_topic(CheckpointStoreConfig)
DEFAULT_TIMEOUT_S = 30.0


class CliError(ChangelogError):
    """A request the command line cannot carry out (unknown application, bad key...)."""


def add_connection_options(parser: argparse.ArgumentParser, *, nested: bool) -> None:
    """``-b``, ``-X`` and ``--timeout``. ``nested``: a command's copy, which leaves
    values given before the command alone unless given again."""
    suppress: dict[str, Any] = {"default": argparse.SUPPRESS} if nested else {}
    parser.add_argument("-b", "--bootstrap-servers",
                        help=f"Kafka brokers (default: ${BOOTSTRAP_ENV})", **suppress)
    parser.add_argument("-X", action="append", metavar="KEY=VALUE",
                        help="librdkafka setting for every client, e.g. -X "
                             "security.protocol=SASL_SSL (repeatable)", **suppress)
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=f"for each Kafka request (default {DEFAULT_TIMEOUT_S:.0f})",
                        **(suppress or {"default": DEFAULT_TIMEOUT_S}))


def add_topic_options(parser: argparse.ArgumentParser, *, nested: bool) -> None:
    """``--checkpoint-topic``, ``--changelog-topic`` and ``--snapshot-topic``.

    The data topics default to None (read them with :func:`changelog_topic` and
    :func:`snapshot_topic`), so ``reset`` can tell a topic the user named from the default.
    """
    parser.add_argument("--checkpoint-topic",
                        help="where applications and their checkpoints are found (default "
                             f"{DEFAULT_CHECKPOINT_TOPIC})",
                        default=argparse.SUPPRESS if nested else DEFAULT_CHECKPOINT_TOPIC)
    parser.add_argument("--changelog-topic",
                        help="the applications' changelog topic (default "
                             f"{DEFAULT_CHANGELOG_TOPIC}): verify notes handles elsewhere; "
                             "reset collects garbage in it too when it is given",
                        default=argparse.SUPPRESS if nested else None)
    parser.add_argument("--snapshot-topic",
                        help="the applications' snapshot topic (default "
                             f"{DEFAULT_SNAPSHOT_TOPIC}): verify notes chunks elsewhere (data "
                             "is always read where the checkpoints say)",
                        default=argparse.SUPPRESS if nested else None)


def changelog_topic(args: argparse.Namespace) -> str:
    """``--changelog-topic``, or the library's default."""
    return getattr(args, "changelog_topic", None) or DEFAULT_CHANGELOG_TOPIC


def snapshot_topic(args: argparse.Namespace) -> str:
    """``--snapshot-topic``, or the library's default."""
    return getattr(args, "snapshot_topic", None) or DEFAULT_SNAPSHOT_TOPIC


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json``: machine-readable output instead of a table."""
    parser.add_argument("--json", action="store_true",
                        help="print JSON (for scripts) instead of a table")


@dataclass(frozen=True)
class Connection:
    """How to reach Kafka, from the shared options."""

    bootstrap_servers: str
    client_config: dict[str, Any]
    request_timeout_s: float = DEFAULT_TIMEOUT_S

    def settings(self) -> dict[str, Any]:
        """librdkafka settings of every client (``bootstrap.servers`` included)."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.client_config}

    def changelog_config(self, topic: str, **fields: Any) -> KafkaChangelogConfig:
        """Config of changelog readers (and, in ``reset``, of garbage collection)."""
        return KafkaChangelogConfig(
            bootstrap_servers=self.bootstrap_servers, topic=topic,
            request_timeout_s=self.request_timeout_s, client_config=dict(self.client_config),
            **fields)

    def checkpoint_config(self, topic: str) -> CheckpointStoreConfig:
        """Config of the checkpoint topic's reader (and writer, in ``reset``)."""
        return CheckpointStoreConfig(
            bootstrap_servers=self.bootstrap_servers, topic=topic,
            request_timeout_s=self.request_timeout_s, client_config=dict(self.client_config))

    def snapshot_config(self, topic: str, max_parallelism: int) -> SnapshotStoreConfig:
        """Config of snapshot chunk readers."""
        return SnapshotStoreConfig(
            bootstrap_servers=self.bootstrap_servers, topic=topic,
            max_parallelism=max_parallelism, request_timeout_s=self.request_timeout_s,
            client_config=dict(self.client_config))


def client_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``-X key=value`` settings as a dict."""
    settings: dict[str, Any] = {}
    for item in getattr(args, "X", None) or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"-X expects key=value, got {item!r}")
        settings[key] = value
    return settings


def bootstrap_servers(args: argparse.Namespace) -> str | None:
    """``-b``, else ``$KAFKA_BOOTSTRAP_SERVERS``, else None."""
    return getattr(args, "bootstrap_servers", None) or os.environ.get(BOOTSTRAP_ENV) or None


def connection(args: argparse.Namespace) -> Connection:
    """The connection the shared options describe; :class:`CliError` without brokers."""
    servers = bootstrap_servers(args)
    if not servers:
        raise CliError(f"no broker: pass --bootstrap-servers or set {BOOTSTRAP_ENV} (for a "
                       "local one, run 'kafka-changelog broker' in another terminal)")
    timeout = getattr(args, "timeout", None) or DEFAULT_TIMEOUT_S
    return Connection(servers, client_settings(args), timeout)
