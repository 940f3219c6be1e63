"""``state APP --operator OP --key K``: one key's state at a checkpoint, without Spark.

Only the key's key group is restored (its snapshot chunks and the changelog of
the subtask that owns it), read-only. Every state registered in the operator is
printed with the key's entry, decoded where the serializer is known.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..keygroups import KeyGroupRange, key_group_for_key
from ..keys import key_json
from ..state.checkpoints.time_properties import PROCESSING_TIME_PROPERTY, recorded_time
from ..state.schema.ttl import live_entry, split_serializer_name
from .keyarg import describe_key, encode_cli_key, key_types_to_use
from .options import CliError, changelog_topic, connection, snapshot_topic
from .output import print_json, progress, table, when
from .readonly import check_operator, open_view, select_checkpoint
from .restore import StateLoader
from .values import decode_entry, raw_json, to_json, to_text


def _run(args: argparse.Namespace) -> int:
    if args.key_type is not None or args.key_hex is not None:
        encode_cli_key(args.key, args.key_type or "string", args.key_hex)  # fail before Kafka
    elif not args.key:
        raise CliError("give the key: --key VALUE (or --key-hex HEX)")
    connected = connection(args)
    with open_view(connected, args.checkpoint_topic) as view:
        checkpoint = select_checkpoint(view, args.application, args.checkpoint)
    check_operator(checkpoint, args.operator)
    types = key_types_to_use(
        args.key_type, checkpoint.properties,
        f"checkpoint {checkpoint.checkpoint_id} of application {checkpoint.application!r}")
    key = encode_cli_key(args.key, ",".join(types or ["string"]), args.key_hex)
    if types is None and args.key_hex is None:
        types = ["string"]
    label = describe_key(key, types)
    max_p = checkpoint.max_parallelism
    key_group = key_group_for_key(key, max_p)
    owners = [s for s in checkpoint.subtasks_of(args.operator)
              if s.keyed is not None and s.keyed.key_group_range.contains(key_group)]
    if not owners:
        raise CliError(
            f"no subtask of operator {args.operator!r} in checkpoint "
            f"{checkpoint.checkpoint_id} of application {args.application!r} has keyed state "
            f"for key group {key_group}")
    with StateLoader(connected, checkpoint, changelog_topic(args),
                     snapshot_topic(args)) as loader:
        state = loader.load(args.operator, KeyGroupRange(key_group, key_group))
    states: list[dict[str, Any]] = []
    shown: list[list[Any]] = []
    # TTL'd entries expired at the checkpoint's processing time are not shown, as the
    # stateful function did not see them.
    at_ms = recorded_time(checkpoint.properties, PROCESSING_TIME_PROPERTY)
    for name in sorted(state.metas):
        meta = state.metas[name]
        entry = state.get(key_group, name, key)
        expiries: Any = None
        with_ttl = split_serializer_name(meta.value_serializer)[1]
        if entry is not None and with_ttl:
            entry, expiries = live_entry(entry, at_ms)
        decoded = decode_entry(meta, entry) if entry is not None else None
        shown_state: dict[str, Any] = {
            "state": name, "kind": meta.kind.value.lower(),
            "value_serializer": meta.value_serializer,
            "map_key_serializer": meta.map_key_serializer,
            "value": to_json(decoded) if entry is not None else None,
            "raw_base64": raw_json(entry) if entry is not None else None,
        }
        if with_ttl:  # TTL'd states only: each value's expiry, ms since the epoch
            shown_state["expires_at_ms"] = (_expiries_json(expiries) if entry is not None
                                            else None)
        states.append(shown_state)
        serializers = (f"{meta.map_key_serializer} -> {meta.value_serializer}"
                       if meta.map_key_serializer else meta.value_serializer)
        shown.append([name, meta.kind.value.lower(), serializers,
                      to_text(decoded) if entry is not None else None])
    found = any(s["value"] is not None for s in states)
    subtask = owners[0]
    if args.json:
        print_json({
            "application": checkpoint.application,
            "checkpoint_id": checkpoint.checkpoint_id,
            "operator": args.operator,
            "key_hex": key.hex(),
            "key": key_json(key, types),
            "key_types": types,
            "key_group": key_group,
            "max_parallelism": max_p,
            "subtask": subtask.subtask_index,
            "parallelism": subtask.parallelism,
            "found": found,
            "states": states,
        })
    else:
        print(f"application {checkpoint.application}, checkpoint {checkpoint.checkpoint_id} "
              f"({when(checkpoint.timestamp_ms)}), operator {args.operator}")
        print(f"key {label}: key group {key_group} of {max_p}, subtask "
              f"{subtask.subtask_index} of {subtask.parallelism}")
        print(table(["STATE", "KIND", "SERIALIZER", "VALUE"], shown))
    if not found:
        progress(f"key {label} has no state in operator {args.operator!r} at checkpoint "
                 f"{checkpoint.checkpoint_id} of application {checkpoint.application!r}")
        return 1
    return 0


def _expiries_json(expiries: Any) -> Any:
    """A TTL'd entry's expiries (ms since the epoch) as JSON: map keys as text (hex when
    they are not UTF-8)."""
    if isinstance(expiries, dict):
        shown = {}
        for map_key, ms in sorted(expiries.items()):
            try:
                shown[map_key.decode()] = ms
            except UnicodeDecodeError:
                shown[map_key.hex()] = ms
        return shown
    return expiries


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             shared: list[argparse.ArgumentParser]) -> None:
    """Add ``state``."""
    text = ("look up one key's state at a checkpoint (restores only its key group, "
            "read-only); exit code 1 when the key has no state")
    parser = commands.add_parser("state", help=text, description=text, parents=shared)
    parser.add_argument("application")
    parser.add_argument("--operator", required=True, help="operator id")
    parser.add_argument("--key", action="append", metavar="VALUE",
                        help="the key; for a composite key its values comma-separated, or "
                             "--key repeated")
    parser.add_argument("--key-type", metavar="TYPE[,TYPE...]",
                        help="Spark type of each key column: string, binary (hex), boolean, "
                             "tinyint..bigint, float, double, decimal(p,s), date, timestamp, "
                             "timestamp_ntz (default: the types the checkpoint records, else "
                             "string)")
    parser.add_argument("--key-hex", metavar="HEX", help="the key's stored bytes, in hex")
    parser.add_argument("--checkpoint", type=int, metavar="ID",
                        help="checkpoint id (default: the latest)")
    parser.set_defaults(func=_run)
