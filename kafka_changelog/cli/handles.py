"""Commands on handle files and topics: ``inspect``, ``dump``, ``kcat``, ``topics``.

Handles are given as a file (raw bytes or base64 text), as base64 on the
command line, or as ``-`` for standard input.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import ChangelogError
from ..handle import ChangelogHandle
from ..kafka import KafkaChangelogConfig, KafkaChangelogHandle, KafkaChangelogReader
from ..kafka.access import connect_admin
from ..kafka.handle import KCAT_SECRET_VARIABLES
from ..kafka.topics import describe_topic
from ..memory import InMemoryChangelogReader
from ..reader import StateChangelogReader
from .options import DEFAULT_CHANGELOG_TOPIC, bootstrap_servers, client_settings, connection


def load_handle(argument: str) -> ChangelogHandle:
    """A handle from a file, base64 text, or ``-`` (stdin)."""
    if argument == "-":
        data = sys.stdin.buffer.read()
    elif Path(argument).is_file():
        data = Path(argument).read_bytes()
    else:
        data = argument.encode()
    try:
        return ChangelogHandle.from_bytes(data)
    except ChangelogError:
        pass
    try:
        decoded = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ChangelogError(
            f"{argument[:60]!r} is neither a handle file nor base64 of a handle"
        ) from exc
    return ChangelogHandle.from_bytes(decoded)


def describe_handle(handle: ChangelogHandle) -> dict[str, Any]:
    """A JSON-friendly summary of a handle."""
    summary: dict[str, Any] = {
        "kind": handle.kind,
        "log_id": handle.log_id,
        "checkpoint_id": handle.checkpoint_id,
        "key_groups": [handle.key_group_range.start, handle.key_group_range.end],
        "state_size_bytes": handle.state_size,
    }
    if isinstance(handle, KafkaChangelogHandle):
        summary.update(
            topic=handle.topic,
            sequence_numbers=[handle.from_sequence_number, handle.to_sequence_number],
            meta_partition=handle.meta_partition,
            ranges=[
                {"partition": r.partition, "start_offset": r.start_offset,
                 "end_offset": r.end_offset, "offsets": r.offset_count,
                 "key_groups": [r.key_groups.start, r.key_groups.end],
                 "record_bytes": r.record_bytes}
                for r in handle.ranges
            ],
        )
    return summary


def _config(args: argparse.Namespace, topic: str = DEFAULT_CHANGELOG_TOPIC,
            **fields: Any) -> KafkaChangelogConfig:
    return connection(args).changelog_config(topic, **fields)


def _inspect(args: argparse.Namespace) -> int:
    print(json.dumps(describe_handle(load_handle(args.handle)), indent=2))
    return 0


def _dump(args: argparse.Namespace) -> int:
    handle = load_handle(args.handle)
    reader: StateChangelogReader[Any] = (
        KafkaChangelogReader(_config(args)) if isinstance(handle, KafkaChangelogHandle)
        else InMemoryChangelogReader())
    with reader:
        changes = list(reader.read(handle))
    for change in changes:
        line: dict[str, Any] = {
            "key_group": None if change.is_meta else change.key_group,
            "meta": change.is_meta,
            "payload_base64": base64.b64encode(change.payload).decode(),
        }
        with contextlib.suppress(UnicodeDecodeError):
            line["payload_utf8"] = change.payload.decode("utf-8")
        print(json.dumps(line))
    return 0


def _kcat(args: argparse.Namespace) -> int:
    handle = load_handle(args.handle)
    if not isinstance(handle, KafkaChangelogHandle):
        raise ChangelogError(f"a {handle.kind} handle has no Kafka records to replay")
    servers = bootstrap_servers(args) or "BROKER"
    settings = client_settings(args)
    for command in handle.kcat_commands(servers, settings):
        print(command)
    secrets = sorted(KCAT_SECRET_VARIABLES[k] for k in settings if k in KCAT_SECRET_VARIABLES)
    if secrets:
        print(f"kafka-changelog: kcat: the commands read {', '.join(secrets)} from the "
              "environment: export them before running them", file=sys.stderr)
    return 0


def _topics(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {"topic": args.topic, "partitions": args.partitions or 1}
    if args.replication_factor is not None:
        fields["replication_factor"] = args.replication_factor
    config = _config(args, **fields)
    admin, metadata = connect_admin(config.admin(), config.request_timeout_s)
    if config.topic not in metadata.topics:
        print(json.dumps({"topic": config.topic, "exists": False}))
        return 1
    info = describe_topic(admin, config)  # raises TopicConfigError when unusable
    print(json.dumps({
        "topic": info.name, "exists": True, "valid": True, "partitions": info.partitions,
        "replication_factor": info.replication_factor,
        "configs": {k: info.configs[k] for k in sorted(info.configs)
                    if k in {"cleanup.policy", "retention.ms", "min.insync.replicas",
                             "max.message.bytes", "retention.bytes", "segment.bytes"}},
    }, indent=2))
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             shared: list[argparse.ArgumentParser]) -> None:
    """Add ``inspect``, ``dump``, ``kcat`` and ``topics`` (``shared``: parent parsers
    with the connection options)."""
    for name, func, text in [
        ("inspect", _inspect, "show a handle's ranges, sizes and key groups"),
        ("dump", _dump, "print a handle's decoded changes as JSON lines"),
        ("kcat", _kcat, "print kcat commands that replay a handle's records"),
    ]:
        sub = commands.add_parser(name, help=text, description=text, parents=shared)
        sub.add_argument("handle", help="handle file, base64 text, or - for stdin")
        sub.set_defaults(func=func)
    text = "show and validate a changelog topic"
    topics = commands.add_parser("topics", help=text, description=text, parents=shared)
    topics.add_argument("--topic", default=DEFAULT_CHANGELOG_TOPIC)
    topics.add_argument("--partitions", type=int, help="minimum partitions expected")
    topics.add_argument("--replication-factor", type=int, help="minimum replication expected")
    topics.set_defaults(func=_topics)
