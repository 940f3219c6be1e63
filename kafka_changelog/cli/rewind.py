"""``rewind APP --to N --yes``: make retained checkpoint N the application's latest again.

What is written, in the crash-safe order of :mod:`kafka_changelog.state.history.rewind`: a copy
of checkpoint N as the new latest (id: the latest + 2), tombstones of the snapshot
chunks only the checkpoints after N name (none another application's checkpoint
uses), then tombstones of those checkpoints. Running the command again finishes an
interrupted rewind. Nothing of other applications sharing the topics changes.

Like ``reset``, it refuses an application that looks alive (a latest checkpoint younger
than ``--alive-within`` seconds, or a driver holding it) unless ``--force``, and without
``--yes`` only shows what it would do. It prints the ``startingOffsets`` JSON of the
input checkpoint N consumed up to (see ``docs/rewind.md``).

Every stored checkpoint counts as retained unless ``--retain``/``--retain-for`` give the
application's retention: its garbage collection discards checkpoints as soon as
retention drops them.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from ..kafka.checkpoint_store import (
    CheckpointStoreConfig,
    KafkaCheckpointStore,
    KafkaCheckpointView,
)
from ..kafka.producer import AckedProducer
from ..state.checkpoints.checkpoint_store import RETAIN_ALL, CheckpointStore
from ..state.checkpoints.driver_claim import DEFAULT_DRIVER_LEASE_S
from ..state.errors import SnapshotWriteError
from ..state.history.rewind import (
    Chunk,
    RewindError,
    RewindPlan,
    check_not_held,
    execute_rewind,
    plan_rewind,
)
from ..state.records import OutRecord
from .options import CliError, Connection, connection
from .output import age, now_ms, outcome, progress
from .readonly import open_view
from .reset import DEFAULT_ALIVE_WITHIN_S


def _looks_alive(store: CheckpointStore, plan: RewindPlan, alive_within_s: float,
                 now: int) -> str | None:
    """Why the application looks alive (None: it does not)."""
    try:
        check_not_held(store, plan.application, DEFAULT_DRIVER_LEASE_S, now)
    except RewindError as exc:
        return f"{exc}; or pass --force"
    latest = store.latest(plan.application)
    if latest is None or now - latest.timestamp_ms >= alive_within_s * 1000:
        return None
    return (f"application {plan.application!r} looks alive: its latest checkpoint "
            f"{latest.checkpoint_id} is {age(latest.timestamp_ms, now)} old (--alive-within "
            f"{alive_within_s:g} s); stop it first, or pass --force")


def _delete_chunks(connected: Connection, application: str, chunks: Sequence[Chunk]) -> None:
    """Tombstone ``chunks`` (idempotent: a tombstone again changes nothing)."""
    by_topic: dict[str, list[OutRecord]] = {}
    for topic, partition, key in chunks:
        by_topic.setdefault(topic, []).append(OutRecord(partition, key.encode(), None, []))
    for topic, records in sorted(by_topic.items()):
        progress(f"rewind: tombstoning {len(records)} snapshot chunks in {topic}")
        producer = AckedProducer(connected.snapshot_config(topic, 128).producer(), topic,
                                 SnapshotWriteError, connected.request_timeout_s)
        try:
            producer.produce_all(records, f"{len(records)} chunk tombstones of the "
                                 f"checkpoints application {application!r} rewound past")
        finally:
            producer.close(connected.request_timeout_s)


def _to_json(plan: RewindPlan, topic: str) -> dict[str, Any]:
    topics = sorted({t for t, _, _ in plan.chunks})
    return {
        "application": plan.application, "checkpoint_topic": topic,
        "to": plan.target_id, "latest_before": plan.latest_id,
        "new_latest": plan.resume_from.checkpoint_id,
        "finishing": plan.finishing, "discard": list(plan.discard),
        "snapshot_chunks": {t: sum(1 for c in plan.chunks if c[0] == t) for t in topics},
        "starting_offsets": plan.starting_offsets,
    }


def _print_plan(plan: RewindPlan, topic: str, done: bool) -> None:
    print(f"application {plan.application} (checkpoint topic {topic}):")
    if plan.nothing_to_do:
        print(f"  checkpoint {plan.resume_from.checkpoint_id} holds the state of checkpoint "
              f"{plan.target_id} and is the latest: nothing to do")
    elif plan.copy is not None:
        verb = "rewound" if done else "would rewind"
        print(f"  {verb} to checkpoint {plan.target_id}: its copy is checkpoint "
              f"{plan.copy.checkpoint_id}, the latest (was {plan.latest_id})")
    else:
        verb = "finished" if done else "would finish"
        print(f"  {verb} the interrupted rewind to checkpoint {plan.target_id} (its copy "
              f"{plan.resume_from.checkpoint_id} is the latest)")
    if plan.discard:
        verb = "discarded" if done else "would discard"
        print(f"  {verb} checkpoints: {', '.join(map(str, plan.discard))}")
        topics = sorted({t for t, _, _ in plan.chunks})
        chunks = ", ".join(f"{sum(1 for c in plan.chunks if c[0] == t)} in {t}" for t in topics)
        verb = "deleted" if done else "would delete"
        print(f"  {verb} snapshot chunks only they use: {chunks or 'none'}")
    offsets = plan.starting_offsets
    print(f"  startingOffsets: {offsets if offsets is not None else '(not recorded)'}")


def _store_config(connected: Connection, args: argparse.Namespace) -> CheckpointStoreConfig:
    if args.retain_for is not None and args.retain is None:
        raise CliError("--retain-for needs --retain (the application's retain)")
    try:
        return dataclasses.replace(
            connected.checkpoint_config(args.checkpoint_topic),
            retain=args.retain if args.retain is not None else RETAIN_ALL,
            retain_for_s=args.retain_for)
    except ValueError as exc:  # retain below 2, an age not positive
        raise CliError(str(exc)) from exc


def _run(args: argparse.Namespace) -> int:
    connected = connection(args)
    topic = args.checkpoint_topic
    config = _store_config(connected, args)
    open_view(connected, topic).close()  # refuses a missing topic, naming those there
    now = now_ms()
    # A dry run only reads (no producer, nothing created).
    with (KafkaCheckpointStore if args.yes else KafkaCheckpointView)(config) as store:
        plan = plan_rewind(store, args.application, args.to, now)
        refusal = None if args.force or plan.nothing_to_do else _looks_alive(
            store, plan, args.alive_within, now)
        if refusal is None and not args.yes:
            refusal = "dry run: nothing written; pass --yes to rewind"
        if refusal is None and not plan.nothing_to_do:
            execute_rewind(store, plan,
                           lambda chunks: _delete_chunks(connected, plan.application, chunks))
    return outcome(args.json, {**_to_json(plan, topic), "rewound": refusal is None},
                   lambda: _print_plan(plan, topic, done=refusal is None), refusal)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             shared: list[argparse.ArgumentParser]) -> None:
    """Add ``rewind``."""
    text = ("make a retained checkpoint the application's latest again (the checkpoints "
            "after it are discarded) and print the startingOffsets of its input; refuses "
            "while the application looks alive")
    parser = commands.add_parser("rewind", help=text, description=text, parents=shared)
    parser.add_argument("application")
    parser.add_argument("--to", type=int, required=True, metavar="CHECKPOINT",
                        help="the retained checkpoint to rewind to")
    parser.add_argument("--yes", action="store_true",
                        help="really rewind (without it: show what would be done)")
    parser.add_argument("--force", action="store_true",
                        help="rewind even if the application looks alive")
    parser.add_argument("--alive-within", type=float, default=DEFAULT_ALIVE_WITHIN_S,
                        metavar="SECONDS",
                        help="an application whose latest checkpoint is younger than this "
                             f"looks alive (default {DEFAULT_ALIVE_WITHIN_S:g})")
    parser.add_argument("--retain", type=int, metavar="COUNT",
                        help="the application's retain: older checkpoints are not "
                             "retained (default: every stored checkpoint is)")
    parser.add_argument("--retain-for", type=float, metavar="SECONDS",
                        help="the application's retain_for_s (with --retain)")
    parser.set_defaults(func=_run)
