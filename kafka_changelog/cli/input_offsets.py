"""``input-offsets APP [--forget TOPIC ... --yes]``: the input an application's state holds.

Shows what the latest checkpoint records of the state's input (Kafka offsets per
topic-partition, as ``startingOffsets``; per file-source directory the newest file
held; the sources of the query that read it): what a streaming query must continue
from (docs/exactly-once.md, "Input offsets"). With ``--forget`` it forgets the offsets of
topics deleted and created again (:mod:`kafka_changelog.state.history.input_forget`): a copy of
the latest checkpoint without them becomes the latest; without ``--yes`` only shows what
it would do. Like ``rewind``, it refuses while a driver holds the application.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..kafka.checkpoint_store import KafkaCheckpointStore, KafkaCheckpointView
from ..state.checkpoints.driver_claim import DEFAULT_DRIVER_LEASE_S
from ..state.checkpoints.input_progress import InputProgress
from ..state.checkpoints.source_offsets import starting_offsets_json
from ..state.history.input_forget import ForgetPlan, execute_forget, plan_forget
from ..state.history.rewind import RewindError, check_not_held
from .options import connection
from .output import now_ms, outcome, print_json, when
from .readonly import open_view, select_checkpoint


def _progress_json(progress: InputProgress) -> dict[str, Any]:
    return {"starting_offsets": starting_offsets_json(progress.offsets)
            if progress.offsets else None,
            "files": {d: {"through_ms": m.through_ms, "files": sorted(m.names_at_mark)}
                      for d, m in sorted(progress.files.items())},
            "sources": list(progress.sources)}


def _print_progress(progress: InputProgress) -> None:
    offsets = starting_offsets_json(progress.offsets) if progress.offsets else "(none recorded)"
    print(f"  Kafka offsets (startingOffsets): {offsets}")
    for directory, mark in sorted(progress.files.items()):
        print(f"  files of {directory}: every file modified before {when(mark.through_ms)} "
              f"({mark.through_ms} ms), and at it: {', '.join(sorted(mark.names_at_mark))}")
    print(f"  sources: {', '.join(progress.sources) or '(not recorded)'}")


def _show(args: argparse.Namespace) -> int:
    connected = connection(args)
    with open_view(connected, args.checkpoint_topic) as view:
        checkpoint = select_checkpoint(view, args.application, None)
    where = f"checkpoint {checkpoint.checkpoint_id} of application {args.application!r}"
    progress = InputProgress.of(checkpoint.properties, where)
    if args.json:
        print_json({"application": args.application, "checkpoint": checkpoint.checkpoint_id,
                    **_progress_json(progress)})
        return 0
    print(f"application {args.application} (checkpoint topic {args.checkpoint_topic}): "
          f"checkpoint {checkpoint.checkpoint_id} holds the input")
    _print_progress(progress)
    return 0


def _forget(args: argparse.Namespace) -> int:
    connected = connection(args)
    topic = args.checkpoint_topic
    open_view(connected, topic).close()  # refuses a missing topic, naming those there
    now = now_ms()
    config = connected.checkpoint_config(topic)
    with (KafkaCheckpointStore if args.yes else KafkaCheckpointView)(config) as store:
        plan = plan_forget(store, args.application, args.forget, now)
        refusal = None
        try:
            check_not_held(store, args.application, DEFAULT_DRIVER_LEASE_S, now,
                           action="forget the input offsets of")
        except RewindError as exc:
            refusal = str(exc)
        if refusal is None and not args.yes:
            refusal = "dry run: nothing written; pass --yes to forget the offsets"
        if refusal is None:
            execute_forget(store, plan)
    return outcome(args.json, _forget_json(plan, topic, refusal is None),
                   lambda: _print_forget(plan, topic, refusal is None), refusal)


def _forget_json(plan: ForgetPlan, topic: str, done: bool) -> dict[str, Any]:
    return {"application": plan.application, "checkpoint_topic": topic,
            "forgot_topics": list(plan.topics), "latest_before": plan.latest.checkpoint_id,
            "new_latest": plan.copy.checkpoint_id, "forgotten": done}


def _print_forget(plan: ForgetPlan, topic: str, done: bool) -> None:
    verb = "forgot" if done else "would forget"
    print(f"application {plan.application} (checkpoint topic {topic}):")
    print(f"  {verb} the input offsets of {', '.join(plan.topics)}: checkpoint "
          f"{plan.copy.checkpoint_id}, a copy of checkpoint {plan.latest.checkpoint_id} "
          "without them, is the latest")
    where = f"checkpoint {plan.copy.checkpoint_id}"
    _print_progress(InputProgress.of(plan.copy.properties, where))


def _run(args: argparse.Namespace) -> int:
    return _forget(args) if args.forget else _show(args)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             shared: list[argparse.ArgumentParser]) -> None:
    """Add ``input-offsets``."""
    text = ("show the input the application's state holds (the startingOffsets a query "
            "continues from); --forget TOPIC forgets a topic deleted and created again")
    parser = commands.add_parser("input-offsets", help=text, description=text,
                                 parents=shared)
    parser.add_argument("application")
    parser.add_argument("--forget", action="append", default=[], metavar="TOPIC",
                        help="forget the offsets recorded for TOPIC (repeatable): for a "
                             "topic deleted and created again")
    parser.add_argument("--yes", action="store_true",
                        help="really forget (without it: show what would be done)")
    parser.set_defaults(func=_run)
