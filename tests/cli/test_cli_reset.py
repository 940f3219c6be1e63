"""``reset``: an application's records go, every other application on the same topics
keeps working, and garbage collection frees the changelog only it needed."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kafka_changelog.kafka.handle import KafkaChangelogHandle
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.checkpoints.checkpoint_store import checkpoint_key, guard_key, latest_key

from .cli_helpers import (
    Deployment,
    Operator,
    Topics,
    chunk_keys,
    cli,
    cli_json,
    clicks_work,
    end_offsets,
    ids_work,
    last_records,
    ranges,
    stored_checkpoints,
)

pytestmark = pytest.mark.broker

HOUR_MS = 3_600_000


@dataclass
class Shared:
    """alpha (stopped an hour ago), gamma (a copy of alpha's latest checkpoint: shares its
    chunks and changelog), beta (checkpointed just now) and pending (only a guard)."""

    cluster: Any
    topics: Topics
    alpha: list[CompletedCheckpoint]
    gamma: CompletedCheckpoint
    beta: list[CompletedCheckpoint]
    pending_guard: str

    def args(self, *args: str) -> list[str]:
        return [*self.topics.cli_args(self.cluster), *args]


@pytest.fixture
def shared(kafka_cluster: Any) -> Iterator[Shared]:
    topics = Topics.fresh()
    old = int(time.time() * 1000) - HOUR_MS
    alpha = Deployment(kafka_cluster, "alpha", topics)
    beta = Deployment(kafka_cluster, "beta", topics)
    pending = Deployment(kafka_cluster, "pending", topics)
    try:
        alpha_ops = {"clicks": Operator(2, clicks_work("user", 10)),
                     "by-id": Operator(1, ids_work(4))}
        # Both rounds materialize: checkpoint 2 rewrites every key group, so checkpoint
        # 1's chunks are alpha's alone once gamma copies checkpoint 2.
        alpha_cps = [alpha.run_round(1, alpha_ops, 1, old, materialize=True),
                     alpha.run_round(2, alpha_ops, 2, old + 1000, materialize=True)]
        gamma = CompletedCheckpoint("gamma", 5, old + 2000, alpha_cps[1].max_parallelism,
                                    alpha_cps[1].subtasks)
        alpha.checkpoints.commit(gamma)
        beta_ops = {"clicks": Operator(3, clicks_work("b", 6))}
        now = int(time.time() * 1000)
        beta_cps = [beta.run_round(1, beta_ops, 1, now, materialize=True),
                    beta.run_round(2, beta_ops, 2, now + 1, materialize=False)]
        pending.coordinator.restore_keyed("clicks", ranges(1)[0], None,
                                          pending.changelog).close()
        (guard,) = {k for k in last_records(kafka_cluster, topics.checkpoint)
                    if k.startswith(b"pending/guard/")}
        yield Shared(kafka_cluster, topics, alpha_cps, gamma, beta_cps,
                     guard.decode().rsplit("/", 1)[1])
    finally:
        for deployment in (alpha, beta, pending):
            deployment.close()


def _lowest_needed(topic: str, high: dict[int, int],
                   remaining: list[CompletedCheckpoint]) -> dict[int, int]:
    """What changelog GC may delete below: every remaining handle's ranges, and the log
    floors of each remaining application's latest checkpoint. (pending's guard holds the
    end offsets of when it was written, after everything else: never the lowest.)"""
    needed = dict(high)
    latest: dict[str, CompletedCheckpoint] = {}
    for checkpoint in remaining:
        known = latest.get(checkpoint.application)
        if known is None or checkpoint.checkpoint_id > known.checkpoint_id:
            latest[checkpoint.application] = checkpoint
        for subtask in checkpoint.subtasks:
            assert subtask.keyed is not None
            for handle in subtask.keyed.changelog:
                assert isinstance(handle, KafkaChangelogHandle)
                for r in handle.ranges:
                    if r.end_offset > r.start_offset:
                        needed[r.partition] = min(needed[r.partition], r.start_offset)
    for checkpoint in latest.values():
        for floor in checkpoint.log_floors:
            if floor.topic == topic:
                needed[floor.partition] = min(needed[floor.partition], floor.offset)
    return needed


def test_reset_deletes_only_its_records_and_frees_its_changelog(shared: Shared) -> None:
    topics = shared.topics
    alpha_chunks = chunk_keys(shared.alpha)
    others_chunks = chunk_keys([shared.gamma, *shared.beta])
    alone, kept = alpha_chunks - others_chunks, alpha_chunks & others_chunks
    assert alone and kept  # checkpoint 1's chunks; checkpoint 2's (gamma's copy)
    assert [w[0] for w in end_offsets(shared.cluster, [topics.changelog]).values()] == [0, 0]

    result = cli(*shared.args("reset", "alpha", "--yes", "--json"))
    assert result.returncode == 0, result.stderr
    high = {p: end for (_, p), (_, end) in
            sorted(end_offsets(shared.cluster, [topics.changelog]).items())}
    expected_start = _lowest_needed(topics.changelog, high, [shared.gamma, *shared.beta])
    assert json.loads(result.stdout) == {
        "application": "alpha", "checkpoint_topic": topics.checkpoint,
        "checkpoint_ids": [1, 2], "latest_pointer": True, "guard_ids": [], "subtask_commits": 0,
        "last_activity_ms": shared.alpha[1].timestamp_ms,
        "snapshot_chunks": {topics.snapshot: len(alone)},
        "shared_snapshot_chunks_kept": len(kept),
        "changelog_topics": [topics.changelog],
        "changelog_gc": [{"topic": topics.changelog,
                          "log_start_before": {"0": 0, "1": 0},
                          "log_start_after": {str(p): o for p, o in expected_start.items()}}],
        "reset": True, "refused": None}
    # alpha's records before gamma's copy of checkpoint 2 are freed on both partitions.
    assert all(offset > 0 for offset in expected_start.values()), expected_start
    assert {p: start for (_, p), (start, _) in
            end_offsets(shared.cluster, [topics.changelog]).items()} == expected_start

    chunks = last_records(shared.cluster, topics.snapshot)
    assert {k for k in alone if chunks[k] is not None} == set()
    assert {k for k in others_chunks if chunks[k] is None} == set()
    records = last_records(shared.cluster, topics.checkpoint)
    assert {k: records[k] for k in (latest_key("alpha").encode(),
                                    checkpoint_key("alpha", 1).encode(),
                                    checkpoint_key("alpha", 2).encode())} == dict.fromkeys(
        (latest_key("alpha").encode(), checkpoint_key("alpha", 1).encode(),
         checkpoint_key("alpha", 2).encode()))
    assert all(records[k] is not None for k in (
        latest_key("beta").encode(), checkpoint_key("beta", 2).encode(),
        latest_key("gamma").encode(), checkpoint_key("gamma", 5).encode()))

    # The other applications are intact: listed, verified, and their state exact.
    assert [a["application"] for a in cli_json(*shared.args("applications"))] == [
        "beta", "gamma", "pending"]
    for application in ("beta", "gamma"):
        verified = cli(*shared.args("verify", application))
        assert verified.returncode == 0, verified.stdout + verified.stderr
    gamma = cli_json(*shared.args("state", "gamma", "--operator", "clicks", "--key", "user-3"))
    assert {s["state"]: s["value"] for s in gamma["states"]}["count"] == 23
    beta = cli_json(*shared.args("state", "beta", "--operator", "clicks", "--key", "b-4"))
    assert {s["state"]: s["value"] for s in beta["states"]}["pages"] == {"home": 2, "p4": 4}
    assert stored_checkpoints(shared.cluster, topics, "alpha") == []

    again = cli(*shared.args("reset", "alpha", "--yes"))
    assert again.returncode == 2
    assert (f"application 'alpha' has no records in checkpoint topic {topics.checkpoint}; "
            "applications there: beta, gamma, pending") in again.stderr


def test_reset_without_yes_or_of_a_live_application_deletes_nothing(shared: Shared) -> None:
    topics = shared.topics
    before = end_offsets(shared.cluster, topics.all())
    dry = cli(*shared.args("reset", "alpha", "--json"))
    assert dry.returncode == 1
    assert "dry run: nothing deleted; pass --yes to reset" in dry.stderr
    plan = json.loads(dry.stdout)
    assert (plan["reset"], plan["checkpoint_ids"], plan["changelog_gc"]) == (False, [1, 2], [])
    assert plan["refused"] == "dry run: nothing deleted; pass --yes to reset"
    # Garbage is collected where the checkpoints say, never in a default topic nobody named.
    unnamed = cli("-b", shared.cluster.bootstrap_servers, "--checkpoint-topic",
                  topics.checkpoint, "reset", "alpha", "--json")
    assert json.loads(unnamed.stdout)["changelog_topics"] == [topics.changelog]
    shown = cli(*shared.args("reset", "alpha"))
    assert shown.stdout.splitlines() == [
        f"application alpha (checkpoint topic {topics.checkpoint}):",
        "  would delete checkpoints: 1, 2; latest pointer: yes; guards: 0",
        f"  would delete snapshot chunks: {plan['snapshot_chunks'][topics.snapshot]} in "
        f"{topics.snapshot} (kept {plan['shared_snapshot_chunks_kept']} that other "
        "applications use)",
        f"  would collect changelog garbage in: {topics.changelog}"]

    live = cli(*shared.args("reset", "beta", "--yes"))
    assert live.returncode == 1
    assert re.search(r"application 'beta' looks alive: its latest checkpoint 2 is \d+s old "
                     r"\(--alive-within 300 s\); stop it first, or pass --force",
                     live.stderr), live.stderr
    starting = cli(*shared.args("reset", "pending", "--yes"))
    assert starting.returncode == 1
    assert ("application 'pending' looks alive: its newest changelog guard (its first "
            "checkpoint is under way) is") in starting.stderr
    assert end_offsets(shared.cluster, topics.all()) == before


def test_force_resets_a_live_application_and_a_guard(shared: Shared) -> None:
    forced = cli_json(*shared.args("reset", "beta", "--yes", "--force"))
    assert (forced["reset"], forced["checkpoint_ids"]) == (True, [1, 2])
    guarded = cli_json(*shared.args("reset", "pending", "--yes", "--alive-within", "0"))
    assert (guarded["reset"], guarded["guard_ids"], guarded["checkpoint_ids"]) == (
        True, [shared.pending_guard], [])
    records = last_records(shared.cluster, shared.topics.checkpoint)
    assert records[guard_key("pending", shared.pending_guard).encode()] is None
    assert [a["application"] for a in cli_json(*shared.args("applications"))] == [
        "alpha", "gamma"]
    verified = cli(*shared.args("verify", "alpha"))
    assert verified.returncode == 0, verified.stdout + verified.stderr
