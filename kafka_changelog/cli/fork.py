"""``fork APP NEW [--checkpoint N]``: start application NEW from APP's checkpoint.

Nothing is copied: NEW's first checkpoint names APP's snapshot chunks and changelog
ranges (rules, inheritance and the crash-safe order: ``kafka_changelog/state/history/fork.py``).
The steps, each safe to repeat (running the command again finishes an interrupted fork):

1. NEW's checkpoint record into APP's checkpoint topic;
2. APP's checkpoint is read again: still retained, else step 1 is undone and the fork
   refused;
3. NEW's latest pointer.

NEW must run with APP's checkpoint, changelog and snapshot topics: the command prints them.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from confluent_kafka.admin import OffsetSpec

from ..kafka.access import connect_admin
from ..kafka.offsets import list_offsets
from ..kafka.producer import AckedProducer
from ..state.checkpoints.checkpoint_store import DEFAULT_RETAIN
from ..state.errors import CheckpointStoreError
from ..state.history.fork import (
    ForkError,
    ForkOutcome,
    ForkPlan,
    ForkRequest,
    check_source_retained,
    plan_fork,
)
from ..state.records import OutRecord
from .options import Connection, connection
from .output import print_json, progress
from .readonly import CheckpointTopicView, open_view


def end_offsets(connected: Connection, topics: frozenset[str]
                ) -> dict[str, dict[int, int]]:
    """Per topic of ``topics`` that exists, per partition: its end offset now."""
    admin, metadata = connect_admin(connected.settings(), connected.request_timeout_s)
    found: dict[str, dict[int, int]] = {}
    for topic in sorted(topics):
        described = metadata.topics.get(topic)
        if described is None or not described.partitions:
            continue
        found[topic] = list_offsets(admin, topic, len(described.partitions),
                                    OffsetSpec.latest(), connected.request_timeout_s)
    return found


def _write(connected: Connection, plan: ForkPlan, records: list[OutRecord],
           what: str) -> None:
    if not records:
        return
    producer = AckedProducer(connected.checkpoint_config(plan.where).producer(), plan.where,
                             CheckpointStoreError, connected.request_timeout_s)
    try:
        producer.produce_all(records, what)
    finally:
        producer.close(connected.request_timeout_s)


def fork(connected: Connection, view: CheckpointTopicView, request: ForkRequest,
         changelog_topic: str | None = None) -> ForkPlan:
    """Fork as the module docstring says; the plan carried out. :class:`ForkError` when
    the fork cannot be made (nothing of it is left then)."""
    plan = plan_fork(view, request, view.topic, lambda topics: end_offsets(connected, topics),
                     [changelog_topic] if changelog_topic else [])
    if plan.outcome is ForkOutcome.ALREADY_FORKED:
        return plan
    target = request.target
    progress(f"fork: writing checkpoint {plan.forked.checkpoint_id} of {target!r} in "
             f"{plan.where}")
    _write(connected, plan, plan.checkpoint_records,
           f"checkpoint {plan.forked.checkpoint_id} of forked application {target!r}")
    try:
        # Every record before ours, transactional ones too (a commit behind a streaming
        # task's open transaction must not be missed).
        view.catch_up(connected.request_timeout_s)
        check_source_retained(view, plan)
    except ForkError:
        _write(connected, plan, plan.undo_records,
               f"tombstones of the undone fork {target!r}")
        raise
    _write(connected, plan, plan.pointer_records,
           f"latest pointer of forked application {target!r}")
    return plan


def _summary(plan: ForkPlan) -> dict[str, Any]:
    topics = plan.topics
    return {
        "application": plan.request.source, "new_application": plan.request.target,
        "checkpoint_id": plan.source_checkpoint.checkpoint_id, "outcome": plan.outcome.value,
        "checkpoint_topic": plan.where, "changelog_topics": sorted(topics.changelog),
        "snapshot_topics": sorted(topics.snapshot),
        "log_floors": [{"topic": f.topic, "partition": f.partition, "offset": f.offset}
                       for f in plan.forked.log_floors],
    }


_DONE: Mapping[ForkOutcome, str] = {
    ForkOutcome.CREATED: "forked",
    ForkOutcome.COMPLETED: "completed the interrupted fork of",
    ForkOutcome.ALREADY_FORKED: "is already a complete fork of",
}


def _print(plan: ForkPlan) -> None:
    summary = _summary(plan)
    source, target = plan.request.source, plan.request.target
    checkpoint_id = plan.source_checkpoint.checkpoint_id
    if plan.outcome is ForkOutcome.ALREADY_FORKED:
        print(f"application {target} {_DONE[plan.outcome]} {source} at checkpoint "
              f"{checkpoint_id}; nothing written")
    else:
        print(f"{_DONE[plan.outcome]} application {source} at checkpoint {checkpoint_id} "
              f"to {target} (checkpoint topic {plan.where}); its next checkpoint is "
              f"{checkpoint_id + 1}")
    unnamed = f"(none named yet: {source}'s)"
    print(f"  run {target} with checkpoint_topic={plan.where!r}, changelog_topic="
          f"{', '.join(summary['changelog_topics']) or unnamed}, snapshot_topic="
          f"{', '.join(summary['snapshot_topics']) or unnamed}")


def _run(args: argparse.Namespace) -> int:
    connected = connection(args)
    request = ForkRequest(args.application, args.new_application, args.checkpoint,
                          args.retain)
    with open_view(connected, args.checkpoint_topic) as view:
        plan = fork(connected, view, request, getattr(args, "changelog_topic", None))
    if args.json:
        print_json(_summary(plan))
    else:
        _print(plan)
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             shared: list[argparse.ArgumentParser]) -> None:
    """Add ``fork``."""
    text = ("start a new application from a checkpoint of an application, sharing its data "
            "(snapshot chunks and changelog ranges) by reference; run it again to finish an "
            "interrupted fork")
    parser = commands.add_parser("fork", help=text, description=text, parents=shared)
    parser.add_argument("application", help="the application to fork (APP)")
    parser.add_argument("new_application", metavar="new-application",
                        help="the application to create (NEW; must not exist)")
    parser.add_argument("--checkpoint", type=int, metavar="N",
                        help="APP's checkpoint to fork from (default: its latest)")
    parser.add_argument("--retain", type=int, default=DEFAULT_RETAIN, metavar="R",
                        help="APP's retention (its checkpoint store's retain): only its newest "
                             f"R checkpoints are forked from (default {DEFAULT_RETAIN})")
    parser.set_defaults(func=_run)
