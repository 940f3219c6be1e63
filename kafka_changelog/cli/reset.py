"""``reset APP --yes``: delete an application's state (``kafka-streams-application-reset``).

What goes, in an order a crash at any point cannot spoil (running reset again
finishes the job):

1. tombstones for the snapshot chunks its checkpoints refer to, except chunks a
   checkpoint of another application refers to as well;
2. tombstones for its latest pointer, its checkpoints, its guards and subtask commits in the
   checkpoint topic, and its driver claim (nothing of other applications);
3. changelog garbage collection (DeleteRecords) with the needs of the remaining
   applications, so records only it needed are freed.

The application must be stopped: reset refuses while it *looks alive*, i.e. its
latest checkpoint (or, before its first, its newest guard) is younger than
``--alive-within`` seconds (default 300), unless ``--force``. Without ``--yes``
it only shows what it would delete.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import OffsetSpec

from ..errors import ChangelogError
from ..gc_types import LogFloor
from ..kafka import KafkaChangelogHandle, KafkaChangelogStorage
from ..kafka.access import connect_admin
from ..kafka.offsets import list_offsets
from ..kafka.producer import AckedProducer
from ..state.checkpoints.checkpoint import CompletedCheckpoint
from ..state.checkpoints.checkpoint_store import checkpoint_key, guard_key, latest_key
from ..state.checkpoints.driver_claim import driver_claim_key
from ..state.errors import CheckpointStoreError, SnapshotWriteError
from ..state.records import OutRecord
from .options import CliError, Connection, connection
from .output import age, now_ms, outcome, progress
from .readonly import CheckpointTopicView, existing_topics, open_view

DEFAULT_ALIVE_WITHIN_S = 300.0

#: A chunk record: (topic, partition, record key).
Chunk = tuple[str, int, str]


@dataclass
class ResetPlan:
    """What resetting one application deletes."""

    application: str
    checkpoint_topic: str
    checkpoint_ids: list[int]
    has_pointer: bool
    guard_ids: list[str]
    #: Keys of its streaming tasks' subtask commits (outputs committed by the tasks).
    subtask_commit_keys: list[str]
    #: When it last showed life: its latest checkpoint, or its newest guard (epoch ms).
    last_activity_ms: int | None
    chunks: list[Chunk]
    #: Chunks of its checkpoints kept because another application's checkpoint uses them.
    shared_chunks: int
    changelog_topics: list[str]
    #: Filled in by :func:`execute`: per changelog topic, log starts before and after GC.
    collected: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The plan (and, once executed, what garbage collection did) as JSON data."""
        topics = sorted({t for t, _, _ in self.chunks})
        return {
            "application": self.application, "checkpoint_topic": self.checkpoint_topic,
            "checkpoint_ids": self.checkpoint_ids, "latest_pointer": self.has_pointer,
            "guard_ids": self.guard_ids, "subtask_commits": len(self.subtask_commit_keys),
            "last_activity_ms": self.last_activity_ms,
            "snapshot_chunks": {t: sum(1 for c in self.chunks if c[0] == t) for t in topics},
            "shared_snapshot_chunks_kept": self.shared_chunks,
            "changelog_topics": self.changelog_topics, "changelog_gc": self.collected,
        }


def _chunks(checkpoints: list[CompletedCheckpoint]) -> set[Chunk]:
    found = set()
    for checkpoint in checkpoints:
        for subtask in checkpoint.subtasks:
            snapshot = subtask.keyed.snapshot if subtask.keyed is not None else None
            if snapshot is not None:
                found |= {(snapshot.topic, c.partition, c.record_key(snapshot.backend_id))
                          for c in snapshot.chunks}
    return found


def _handles(checkpoints: list[CompletedCheckpoint]) -> list[KafkaChangelogHandle]:
    return [h for cp in checkpoints for s in cp.subtasks if s.keyed is not None
            for h in s.keyed.changelog if isinstance(h, KafkaChangelogHandle)]


def plan_reset(view: CheckpointTopicView, application: str,
               changelog_topic: str | None = None) -> ResetPlan:
    """What resetting ``application`` deletes, from the checkpoint topic as it is now.

    Garbage is collected in the changelog topics its checkpoints name, and in
    ``changelog_topic`` if given: never in a topic nobody named, which applications
    with another checkpoint topic might use (their needs are not visible here).
    """
    known = view.known_applications()
    if application not in known:
        raise CliError(
            f"application {application!r} has no records in checkpoint topic {view.topic}; "
            f"applications there: {', '.join(known) or 'none'}")
    ids = view.checkpoint_ids(application)
    mine = [view.get(application, i) for i in ids]
    others = [cp for cp in view.all_checkpoints() if cp.application != application]
    own_chunks, other_chunks = _chunks(mine), _chunks(others)
    guards = view.guards(application)
    times = [cp.timestamp_ms for cp in mine[-1:]] + [
        g.timestamp_ms for g in guards if g.timestamp_ms is not None]
    return ResetPlan(
        application=application, checkpoint_topic=view.topic, checkpoint_ids=ids,
        has_pointer=view.has_pointer(application), guard_ids=[g.guard_id for g in guards],
        subtask_commit_keys=view.subtask_commit_keys(application),
        last_activity_ms=max(times) if times else None,
        chunks=sorted(own_chunks - other_chunks),
        shared_chunks=len(own_chunks & other_chunks),
        changelog_topics=sorted({h.topic for h in _handles(mine)}
                                | ({changelog_topic} if changelog_topic else set())))


def looks_alive(plan: ResetPlan, alive_within_s: float, now: int) -> str | None:
    """Why the application looks alive (None: it does not)."""
    if plan.last_activity_ms is None:
        return None
    if now - plan.last_activity_ms >= alive_within_s * 1000:
        return None
    what = (f"its latest checkpoint {plan.checkpoint_ids[-1]}" if plan.checkpoint_ids
            else "its newest changelog guard (its first checkpoint is under way)")
    return (f"application {plan.application!r} looks alive: {what} is "
            f"{age(plan.last_activity_ms, now)} old (--alive-within {alive_within_s:g} s); "
            "stop it first, or pass --force")


def _produce(settings: dict[str, Any], topic: str, records: list[OutRecord], what: str,
             error_type: Callable[[str], ChangelogError], timeout_s: float) -> None:
    # A refusal (no ACL for an idempotent producer) raises KafkaAccessError naming it.
    producer = AckedProducer(settings, topic, error_type, timeout_s)
    try:
        producer.produce_all(records, what)
    finally:
        producer.close(timeout_s)


def _tombstones(connected: Connection, plan: ResetPlan) -> None:
    timeout = connected.request_timeout_s
    by_topic: dict[str, list[OutRecord]] = {}
    for topic, partition, key in plan.chunks:
        by_topic.setdefault(topic, []).append(OutRecord(partition, key.encode(), None, []))
    for topic, records in sorted(by_topic.items()):
        progress(f"reset: tombstoning {len(records)} snapshot chunks in {topic}")
        _produce(connected.snapshot_config(topic, 128).producer(), topic, records,
                 f"{len(records)} chunk tombstones of application {plan.application!r}",
                 SnapshotWriteError, timeout)
    # The pointer first: until the last checkpoint tombstone, the latest is still the
    # newest checkpoint left, so a crash in between leaves a consistent view.
    app, topic = plan.application, plan.checkpoint_topic
    keys = [latest_key(app)] + [checkpoint_key(app, i) for i in plan.checkpoint_ids] + [
        guard_key(app, g) for g in plan.guard_ids] + plan.subtask_commit_keys + [
        driver_claim_key(app)]
    progress(f"reset: tombstoning {len(plan.checkpoint_ids)} checkpoints, the latest pointer "
             f"and {len(plan.guard_ids)} guards of {app!r} in {topic}")
    _produce(connected.checkpoint_config(topic).producer(), topic,
             [OutRecord(0, k.encode(), None, []) for k in keys],
             f"tombstones of application {app!r}", CheckpointStoreError, timeout)


def _collect(connected: Connection, plan: ResetPlan) -> None:
    existing = existing_topics(connected)
    view = CheckpointTopicView(connected.checkpoint_config(plan.checkpoint_topic))

    def still_needed() -> tuple[list[KafkaChangelogHandle], list[LogFloor]]:
        # Asked by the storage after it read the high watermarks (as a coordinator's GC).
        return _handles(view.all_checkpoints()), view.log_floors()

    try:
        for topic in plan.changelog_topics:
            if topic not in existing:
                continue
            progress(f"reset: collecting garbage in changelog topic {topic}")
            with KafkaChangelogStorage(connected.changelog_config(topic, partitions=1)) as store:
                admin, _ = connect_admin(connected.settings(), connected.request_timeout_s)
                before = list_offsets(admin, topic, store.topic.partitions,
                                      OffsetSpec.earliest(), connected.request_timeout_s)
                after = store.collect_garbage(still_needed).deleted_below
            plan.collected.append({
                "topic": topic,
                "log_start_before": {str(p): o for p, o in sorted(before.items())},
                "log_start_after": {str(p): o for p, o in sorted(after.items())}})
    finally:
        view.close()


def execute(connected: Connection, plan: ResetPlan) -> None:
    """Delete what the plan lists, then collect changelog garbage (module docstring)."""
    _tombstones(connected, plan)
    try:
        _collect(connected, plan)
    except Exception as exc:
        raise CliError(
            f"application {plan.application!r} was reset (its checkpoints and chunks are "
            f"deleted), but changelog garbage collection failed: {exc}. The next commit of "
            "any application sharing the topics collects it again") from exc


def _print_plan(plan: ResetPlan, done: bool) -> None:
    verb = "deleted" if done else "would delete"
    ids = ", ".join(map(str, plan.checkpoint_ids)) or "none"
    print(f"application {plan.application} (checkpoint topic {plan.checkpoint_topic}):")
    print(f"  {verb} checkpoints: {ids}; latest pointer: {'yes' if plan.has_pointer else 'no'}"
          f"; guards: {len(plan.guard_ids)}")
    topics = sorted({t for t, _, _ in plan.chunks})
    chunks = ", ".join(f"{sum(1 for c in plan.chunks if c[0] == t)} in {t}" for t in topics)
    print(f"  {verb} snapshot chunks: {chunks or 'none'} (kept {plan.shared_chunks} that other "
          "applications use)")
    if not done:
        print("  would collect changelog garbage in: "
              f"{', '.join(plan.changelog_topics) or 'none (no checkpoint names a topic)'}")
    for gc in plan.collected:
        moved = ", ".join(f"[{p}] {gc['log_start_before'][p]} -> {o}"
                          for p, o in gc["log_start_after"].items())
        print(f"  changelog {gc['topic']} log start: {moved}")


def _run(args: argparse.Namespace) -> int:
    connected = connection(args)
    with open_view(connected, args.checkpoint_topic) as view:
        plan = plan_reset(view, args.application, getattr(args, "changelog_topic", None))
    alive = looks_alive(plan, args.alive_within, now_ms())
    refusal = None if args.force else alive
    if refusal is None and not args.yes:
        refusal = "dry run: nothing deleted; pass --yes to reset"
    if refusal is None:
        execute(connected, plan)
    return outcome(args.json, {**plan.to_json(), "reset": refusal is None},
                   lambda: _print_plan(plan, done=refusal is None), refusal)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             shared: list[argparse.ArgumentParser]) -> None:
    """Add ``reset``."""
    text = ("delete an application's checkpoints, guards and snapshot chunks (not those other "
            "applications use) and free its changelog records; refuses while the application "
            "looks alive")
    parser = commands.add_parser("reset", help=text, description=text, parents=shared)
    parser.add_argument("application")
    parser.add_argument("--yes", action="store_true",
                        help="really delete (without it: show what would be deleted)")
    parser.add_argument("--force", action="store_true",
                        help="reset even if the application looks alive")
    parser.add_argument("--alive-within", type=float, default=DEFAULT_ALIVE_WITHIN_S,
                        metavar="SECONDS",
                        help="an application whose latest checkpoint (or newest guard) is "
                             f"younger than this looks alive (default {DEFAULT_ALIVE_WITHIN_S:g})")
    parser.set_defaults(func=_run)
