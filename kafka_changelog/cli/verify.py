"""``verify APP``: restore every subtask of a checkpoint in this process, read-only.

Each subtask's key-group range is loaded as a restore would (snapshot chunks,
then the changelog) and its size reported; a chunk that is gone or corrupt, a
changelog truncated below a handle, an undecodable record or a missing topic
is a problem, named with its topic, partition and offset or chunk. Exit code 1
when there is any.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from ..errors import ChangelogError, KafkaConnectionError
from ..state.checkpoints.checkpoint import CompletedCheckpoint, StateTopics, SubtaskState
from ..state.tables.protocol import KeyedStateTable
from .options import Connection, changelog_topic, connection, snapshot_topic
from .output import print_json, progress, size, table, when
from .readonly import existing_topics, open_view, select_checkpoint
from .restore import StateLoader


@dataclass
class SubtaskReport:
    """What restoring one subtask found."""

    operator: str
    subtask: int
    key_groups: tuple[int, int]
    keys: int = 0
    entries: int = 0
    state_bytes: int = 0
    snapshot_bytes: int = 0
    changelog_bytes: int = 0
    changelog_records_read: int = 0
    #: None: restored; else what went wrong (error type and message).
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data."""
        return {"operator": self.operator, "subtask": self.subtask,
                "key_groups": list(self.key_groups), "keys": self.keys,
                "entries": self.entries, "state_bytes": self.state_bytes,
                "snapshot_bytes": self.snapshot_bytes, "changelog_bytes": self.changelog_bytes,
                "changelog_records_read": self.changelog_records_read,
                "ok": self.problem is None, "problem": self.problem}


@dataclass
class VerifyReport:
    """The whole verification: per subtask, plus problems not tied to one."""

    checkpoint: CompletedCheckpoint
    subtasks: list[SubtaskReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Worth knowing, not a problem (data in other topics than the options name).
    notes: list[str] = field(default_factory=list)

    @property
    def all_problems(self) -> list[str]:
        """Every problem, each naming where it is."""
        return self.problems + [
            f"operator {s.operator!r} subtask {s.subtask} (key groups {s.key_groups[0]}-"
            f"{s.key_groups[1]}): {s.problem}" for s in self.subtasks if s.problem is not None]


def measure(state: KeyedStateTable, report: SubtaskReport) -> None:
    """Count keys, (state, key) entries and their bytes (keys and values)."""
    keys: set[tuple[int, bytes]] = set()
    for key_group in state.key_groups():
        for _, key, entry in state.entries(key_group):
            keys.add((key_group, key))
            report.entries += 1
            if isinstance(entry, bytes):
                report.state_bytes += len(key) + len(entry)
            elif isinstance(entry, list):
                report.state_bytes += len(key) + sum(len(v) for v in entry)
            else:
                report.state_bytes += len(key) + sum(len(k) + len(v)
                                                     for k, v in entry.items())
    report.keys = len(keys)


def _topics_of(subtask: SubtaskState) -> set[str]:
    assert subtask.keyed is not None
    return set(subtask.keyed.topics().all)


def _notes(keyed: list[SubtaskState], changelog_topic: str, snapshot_topic: str) -> list[str]:
    notes = []
    found = StateTopics()
    for subtask in keyed:
        if subtask.keyed is not None:
            found |= subtask.keyed.topics()
    for kind, topics, option, expected in [
        ("changelog", found.changelog, "--changelog-topic", changelog_topic),
        ("snapshot", found.snapshot, "--snapshot-topic", snapshot_topic),
    ]:
        elsewhere = sorted(topics - {expected})
        if elsewhere:
            notes.append(f"the checkpoint's {kind} is in topic(s) {', '.join(elsewhere)}, not "
                         f"in {expected} ({option}); read from there")
    return notes


def verify(connected: Connection, checkpoint: CompletedCheckpoint, changelog_topic: str,
           snapshot_topic: str) -> VerifyReport:
    """Restore every keyed subtask of ``checkpoint``; progress goes to stderr."""
    report = VerifyReport(checkpoint)
    existing = existing_topics(connected)
    keyed = [s for op in checkpoint.operators() for s in checkpoint.subtasks_of(op)
             if s.keyed is not None]
    report.notes = _notes(keyed, changelog_topic, snapshot_topic)
    missing = sorted({t for s in keyed for t in _topics_of(s)} - existing)
    for topic in missing:
        report.problems.append(f"topic {topic!r}, which the checkpoint's handles name, does "
                               f"not exist on {connected.bootstrap_servers}")
    with StateLoader(connected, checkpoint, changelog_topic, snapshot_topic) as loader:
        for number, subtask in enumerate(keyed, 1):
            handle = subtask.keyed
            assert handle is not None
            kgs = handle.key_group_range
            progress(f"verify: operator {subtask.operator_id!r} subtask {subtask.subtask_index} "
                     f"(key groups {kgs.start}-{kgs.end}), {number} of {len(keyed)}")
            result = SubtaskReport(
                subtask.operator_id, subtask.subtask_index, (kgs.start, kgs.end),
                snapshot_bytes=handle.snapshot.state_size if handle.snapshot else 0,
                changelog_bytes=sum(h.state_size for h in handle.changelog))
            report.subtasks.append(result)
            gone = sorted(_topics_of(subtask) & set(missing))
            if gone:
                result.problem = f"not restored: topic(s) {', '.join(gone)} do not exist"
                continue
            records_before = loader.changelog.records_read
            try:
                state = loader.load(subtask.operator_id, kgs)
            except KafkaConnectionError:
                raise  # not a problem of the data: the broker refused or is away
            except (ChangelogError, ValueError) as exc:
                result.problem = f"{type(exc).__name__}: {exc}"
            else:
                measure(state, result)
            result.changelog_records_read = loader.changelog.records_read - records_before
    return report


def _print_table(report: VerifyReport) -> None:
    cp = report.checkpoint
    print(f"application {cp.application}, checkpoint {cp.checkpoint_id} "
          f"({when(cp.timestamp_ms)})")
    print(table(
        ["OPERATOR", "SUBTASK", "KEY_GROUPS", "KEYS", "ENTRIES", "STATE", "SNAPSHOT",
         "CHANGELOG", "STATUS"],
        [[s.operator, s.subtask, f"{s.key_groups[0]}-{s.key_groups[1]}", s.keys, s.entries,
          size(s.state_bytes), size(s.snapshot_bytes), size(s.changelog_bytes),
          "ok" if s.problem is None else "FAILED"] for s in report.subtasks]))
    for note in report.notes:
        print(f"note: {note}")
    problems = report.all_problems
    if problems:
        print(f"{len(problems)} problem(s):")
        for problem in problems:
            print(f"- {problem}")
    else:
        print(f"all {len(report.subtasks)} subtask(s) restored: "
              f"{sum(s.keys for s in report.subtasks)} keys, "
              f"{size(sum(s.state_bytes for s in report.subtasks))} of state")


def _run(args: argparse.Namespace) -> int:
    connected = connection(args)
    with open_view(connected, args.checkpoint_topic) as view:
        checkpoint = select_checkpoint(view, args.application, args.checkpoint)
    report = verify(connected, checkpoint, changelog_topic(args), snapshot_topic(args))
    problems = report.all_problems
    if args.json:
        print_json({"application": checkpoint.application,
                    "checkpoint_id": checkpoint.checkpoint_id,
                    "ok": not problems, "problems": problems, "notes": report.notes,
                    "subtasks": [s.to_json() for s in report.subtasks]})
    else:
        _print_table(report)
    if problems:
        progress(f"verify: {len(problems)} problem(s) in checkpoint {checkpoint.checkpoint_id} "
                 f"of application {checkpoint.application!r}")
        return 1
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             shared: list[argparse.ArgumentParser]) -> None:
    """Add ``verify``."""
    text = ("restore every subtask of a checkpoint in this process (read-only) and report "
            "sizes and any missing or truncated data; exit code 1 on a problem")
    parser = commands.add_parser("verify", help=text, description=text, parents=shared)
    parser.add_argument("application")
    parser.add_argument("--checkpoint", type=int, metavar="ID",
                        help="checkpoint id (default: the latest)")
    parser.set_defaults(func=_run)
