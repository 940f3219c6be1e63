"""``applications`` and ``checkpoints``: what the checkpoint topic holds (read-only)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from ..kafka.handle import KafkaChangelogHandle
from ..state.checkpoints.checkpoint import CompletedCheckpoint, StateTopics, SubtaskState
from .options import connection
from .output import age, now_ms, print_json, size, table, when
from .readonly import CheckpointTopicView, open_view, select_checkpoint


def application_summary(view: CheckpointTopicView, application: str,
                        now: int) -> dict[str, Any]:
    """One application: its latest checkpoint, operators, stored checkpoint ids, guards."""
    ids = view.checkpoint_ids(application)
    latest = view.latest(application) if ids else None
    guards = view.guards(application)
    topics = StateTopics()
    for stored in _stored(view, application, ids):
        topics |= stored.topics()
    summary: dict[str, Any] = {
        "application": application,
        "latest_checkpoint": latest.checkpoint_id if latest else None,
        "timestamp_ms": latest.timestamp_ms if latest else None,
        "time": when(latest.timestamp_ms) if latest else None,
        "age_s": (now - latest.timestamp_ms) / 1000 if latest else None,
        "max_parallelism": latest.max_parallelism if latest else None,
        "operators": [{"operator": op, "parallelism": _parallelism(latest, op)}
                      for op in latest.operators()] if latest else [],
        "checkpoint_ids": ids,
        "properties": dict(latest.properties) if latest else {},
        "changelog_topics": sorted(topics.changelog),
        "snapshot_topics": sorted(topics.snapshot),
        "guards": [{"guard_id": g.guard_id, "timestamp_ms": g.timestamp_ms} for g in guards],
    }
    return summary


def _stored(view: CheckpointTopicView, application: str,
            ids: Iterable[int]) -> list[CompletedCheckpoint]:
    return [view.get(application, i) for i in ids]


def _parallelism(checkpoint: CompletedCheckpoint, operator: str) -> int:
    return checkpoint.subtasks_of(operator)[0].parallelism


def _kafka_handles(subtasks: Iterable[SubtaskState]) -> list[KafkaChangelogHandle]:
    return [h for s in subtasks if s.keyed is not None for h in s.keyed.changelog
            if isinstance(h, KafkaChangelogHandle)]


def offset_ranges(handles: Iterable[KafkaChangelogHandle]) -> list[dict[str, Any]]:
    """Per topic partition, the offsets ``[start, end)`` the handles span together."""
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for handle in handles:
        for r in handle.ranges:
            if r.end_offset <= r.start_offset:
                continue
            key = (handle.topic, r.partition)
            low, high = spans.get(key, (r.start_offset, r.end_offset))
            spans[key] = (min(low, r.start_offset), max(high, r.end_offset))
    return [{"topic": t, "partition": p, "start_offset": low, "end_offset": high}
            for (t, p), (low, high) in sorted(spans.items())]


def _subtask_summary(subtask: SubtaskState) -> dict[str, Any]:
    keyed = subtask.keyed
    operator = subtask.operator
    summary: dict[str, Any] = {"subtask": subtask.subtask_index}
    if keyed is not None:
        snapshot = keyed.snapshot
        handles = [h for h in keyed.changelog if isinstance(h, KafkaChangelogHandle)]
        summary.update(
            key_groups=[keyed.key_group_range.start, keyed.key_group_range.end],
            backend_id=keyed.backend_id,
            materialization_id=keyed.materialization_id,
            snapshot_bytes=snapshot.state_size if snapshot is not None else 0,
            snapshot_chunks=len(snapshot.chunks) if snapshot is not None else 0,
            changelog_bytes=sum(h.state_size for h in keyed.changelog),
            changelog=offset_ranges(handles),
        )
    if operator is not None:
        summary["operator_state_elements"] = sum(
            len(v) for states in (operator.list_states, operator.union_states)
            for v in states.values())
    return summary


def checkpoint_summary(checkpoint: CompletedCheckpoint) -> dict[str, Any]:
    """One checkpoint: time, properties, log floors, and per operator its sizes and offsets."""
    operators = []
    for op in checkpoint.operators():
        subtasks = checkpoint.subtasks_of(op)
        keyed = [s.keyed for s in subtasks if s.keyed is not None]
        operators.append({
            "operator": op,
            "parallelism": subtasks[0].parallelism,
            "materialization_ids": sorted({k.materialization_id for k in keyed}),
            "snapshot_bytes": sum(k.snapshot.state_size for k in keyed
                                  if k.snapshot is not None),
            "changelog_bytes": sum(h.state_size for k in keyed for h in k.changelog),
            "changelog": offset_ranges(_kafka_handles(subtasks)),
            "subtasks": [_subtask_summary(s) for s in subtasks],
        })
    return {
        "checkpoint_id": checkpoint.checkpoint_id,
        "timestamp_ms": checkpoint.timestamp_ms,
        "time": when(checkpoint.timestamp_ms),
        "max_parallelism": checkpoint.max_parallelism,
        "properties": dict(checkpoint.properties),
        "log_floors": [{"topic": f.topic, "partition": f.partition, "offset": f.offset}
                       for f in checkpoint.log_floors],
        "operators": operators,
    }


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids)) if ids else "-"


def show_ranges(ranges: list[dict[str, Any]]) -> str:
    """``topic[p]:[start,end)`` per partition, comma-separated (``-`` when none)."""
    return ", ".join(f"{r['topic']}[{r['partition']}]:[{r['start_offset']},{r['end_offset']})"
                     for r in ranges) or "-"


def _materializations(ids: list[int]) -> str:
    if not any(ids):
        return "none"  # id 0: no materialization yet, the changelog holds everything
    return str(ids[0]) if len(ids) == 1 else f"{ids[0]}..{ids[-1]} ({len(ids)} ids)"


def _applications(args: argparse.Namespace) -> int:
    now = now_ms()
    with open_view(connection(args), args.checkpoint_topic) as view:
        found = [application_summary(view, app, now) for app in view.known_applications()]
    if args.json:
        print_json(found)
        return 0
    if not found:
        print(f"no applications in checkpoint topic {args.checkpoint_topic}")
        return 0
    rows = []
    for app in found:
        latest = app["latest_checkpoint"]
        pending = f"none yet ({len(app['guards'])} guard(s))" if app["guards"] else "none"
        rows.append([
            app["application"],
            latest if latest is not None else pending,
            app["time"], age(app["timestamp_ms"], now) if latest is not None else None,
            ", ".join(f"{o['operator']} (p={o['parallelism']})" for o in app["operators"])
            or None,
            app["max_parallelism"], _ids(app["checkpoint_ids"]),
        ])
    print(table(["APPLICATION", "LATEST", "TIME", "AGE", "OPERATORS", "MAX_P",
                 "CHECKPOINTS"], rows))
    return 0


def _checkpoints(args: argparse.Namespace) -> int:
    with open_view(connection(args), args.checkpoint_topic) as view:
        select_checkpoint(view, args.application, None)  # a clear error if it has none
        stored = [view.get(args.application, i) for i in view.checkpoint_ids(args.application)]
    summaries = [checkpoint_summary(cp) for cp in stored]
    if args.json:
        print_json({"application": args.application, "checkpoints": summaries})
        return 0
    rows = []
    for cp in summaries:
        query = cp["properties"].get("spark.batch_id")
        for op in cp["operators"]:
            rows.append([cp["checkpoint_id"], cp["time"], query, op["operator"],
                         op["parallelism"], _materializations(op["materialization_ids"]),
                         size(op["snapshot_bytes"]), size(op["changelog_bytes"]),
                         show_ranges(op["changelog"])])
        if not cp["operators"]:
            rows.append([cp["checkpoint_id"], cp["time"], query, None, None, None, None,
                         None, None])
    print(table(["CHECKPOINT", "TIME", "BATCH", "OPERATOR", "P", "MATERIALIZATION",
                 "SNAPSHOT", "CHANGELOG", "CHANGELOG_OFFSETS"], rows))
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             shared: list[argparse.ArgumentParser]) -> None:
    """Add ``applications`` and ``checkpoints``."""
    text = ("list the applications in the checkpoint topic: latest checkpoint, operators, "
            "parallelism, stored checkpoint ids")
    listing = commands.add_parser("applications", help=text, description=text, parents=shared)
    listing.set_defaults(func=_applications)
    text = ("show an application's stored checkpoints: time, and per operator the "
            "materialization, snapshot and changelog sizes and changelog offset ranges")
    checkpoints = commands.add_parser("checkpoints", help=text, description=text,
                                      parents=shared)
    checkpoints.add_argument("application")
    checkpoints.set_defaults(func=_checkpoints)
