"""Event-time and processing-time timers fire exactly once across kill -9 of the driver
and of a Python worker and across rescales 2 -> 3 -> 1, against a real broker and Spark:
the sessions job (``examples.sessions``) with processing-time reminders
(``tests.spark.crashing_sessions --reminders``) run as a child process, its outputs
(session summaries and reminders written with the checkpoint in Kafka transactions) and
its state checked against a model computed from the clicks."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from examples.sessions import (
    CLICKS,
    GAP_MS,
    clicks,
    expected_sessions,
    produce_clicks,
    read_sessions,
)
from kafka_changelog import key_group_range_for_operator
from kafka_changelog.local_kafka.process import die_with_parent
from spark_integration.checkpoint_properties import BATCH_ID
from spark_integration.streaming import StreamingStateConfig
from spark_integration.streaming.worker_resources import WorkerResources
from tests.spark.crashing_sessions import SINCE_REMINDER
from tests.spark.jobs import NO_CODEGEN

pytestmark = [pytest.mark.spark, pytest.mark.broker]

REPO = Path(__file__).resolve().parents[2]
USERS = 40
PHASE_A = 1_200  # clicks whose sessions all close once phase B moves the watermark
PHASE_B = 900    # later clicks (three batches): the sessions left open at the end
PER_BATCH = 300


def run(servers: str, prefix: str, checkpoint_dir: Path, parallelism: int, expected: int,
        lateness_minutes: float, kill_at: str | None = None,
        task_kills: tuple[str, ...] = (), fault_dir: Path | None = None,
        master: str | None = None) -> int:
    faults: list[str] = []
    if kill_at:
        faults += ["--kill-at", kill_at]
    for point in task_kills:
        faults += ["--kill-task-at", point]
    if fault_dir:
        faults += ["--fault-dir", str(fault_dir)]
    command = [sys.executable, "-m", "tests.spark.crashing_sessions", *faults, "--reminders",
               "--",
               "--bootstrap-servers", servers, "--application", prefix,
               "--input-topic", f"{prefix}-clicks", "--output-topic", f"{prefix}-sessions",
               "--topic-prefix", prefix, "--checkpoint-dir", str(checkpoint_dir),
               "--parallelism", str(parallelism), "--expected-events", str(expected),
               "--max-per-batch", str(PER_BATCH), "--lateness-minutes", str(lateness_minutes),
               *(["--master", master] if master else []),
               *[arg for key, value in NO_CODEGEN.items()
                 for arg in ("--spark-conf", f"{key}={value}")]]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,
                          preexec_fn=die_with_parent())
    if kill_at:
        assert done.returncode == -9, done.stderr[-3000:]
    else:
        assert done.returncode == 0, done.stderr[-3000:]
    return done.returncode


def config_of(servers: str, prefix: str) -> StreamingStateConfig:
    return StreamingStateConfig(application=prefix, operator_id="sessions",
                                bootstrap_servers=servers, parallelism=1,
                                changelog_topic=f"{prefix}-changelog",
                                snapshot_topic=f"{prefix}-snapshots",
                                checkpoint_topic=f"{prefix}-checkpoints", partitions=8)


def latest_batch(config: StreamingStateConfig) -> int:
    checkpoint = WorkerResources.coordinator(config).checkpoint()
    assert checkpoint is not None
    return int(checkpoint.properties[BATCH_ID])


def sessions_and_reminders(outputs: list[tuple[int, str, int, int, int]]
                           ) -> tuple[list[tuple[str, int, int, int]],
                                      list[tuple[str, int, int]]]:
    """Session summaries (user, start, end, clicks) and reminders (user, time, clicks)."""
    sessions = sorted((user, start, end, n) for _, user, start, end, n in outputs if end != -1)
    reminders = sorted((user, start, n) for _, user, start, end, n in outputs if end == -1)
    return sessions, reminders


def test_event_and_processing_time_timers_fire_exactly_once_across_kills_and_rescales(
    kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"sessions-{uuid.uuid4().hex[:8]}"
    servers = kafka_cluster.bootstrap_servers
    settings = {"bootstrap.servers": servers}
    phase_a = clicks(PHASE_A, USERS)
    span_minutes = (phase_a[-1]["ts"] - phase_a[0]["ts"]) / 60_000
    # Lateness of the whole first phase: none of its clicks is late, whatever order the
    # input's partitions are read in, and its sessions close only once phase B comes.
    lateness = span_minutes + 1
    produce_clicks(settings, f"{prefix}-clicks", phase_a)
    checkpoints = tmp_path / "chk"
    config = config_of(servers, prefix)
    try:
        # Killed after the checkpoint of phase A's last batch (batch 3): the next run
        # re-runs it for Spark and commits nothing again. (A kill before the checkpoint
        # record, whose commits the next run reuses, is in test_streaming_exactly_once.)
        run(servers, prefix, checkpoints, 2, PHASE_A, lateness, kill_at="after_commit:3")
        assert latest_batch(config) == 3
        opened, _ = sessions_and_reminders(read_sessions(settings, f"{prefix}-sessions"))
        # Phase B: clicks a second apart, far after phase A (by more than
        # the lateness and the gap), read in at least two batches: the second runs with
        # a watermark past every phase-A session's end, and fires their timers.
        first = phase_a[-1]["ts"] + int(lateness * 60_000) + 2 * GAP_MS
        phase_b = [{**c, "ts": first + i * 1_000} for i, c in
                   enumerate(clicks(PHASE_B, USERS, first_seq=PHASE_A))]
        produce_clicks(settings, f"{prefix}-clicks", phase_b)
        firing = latest_batch(config) + 2
        fault_dir = tmp_path / "faults"
        fault_dir.mkdir()
        # The batch whose timers fire: a task's Python worker is killed inside its
        # transaction (Spark runs the task again), then the driver after our commit.
        run(servers, prefix, checkpoints, 3, PHASE_A + PHASE_B, lateness,
            kill_at=f"after_commit:{firing}",
            task_kills=(f"subtask_in_transaction:{firing}:0",), fault_dir=fault_dir,
            master="local[3,4]")  # a failed task runs again
        assert list(fault_dir.iterdir()), "the Python worker was not killed"
        run(servers, prefix, checkpoints, 1, PHASE_A + PHASE_B, lateness)
        summaries, reminders = sessions_and_reminders(
            read_sessions(settings, f"{prefix}-sessions"))
        expected_a = expected_sessions(phase_a)
        # Every session of phase A exactly once (by the gap in phase A, or by its timer).
        assert summaries == expected_a
        assert len(opened) < len(expected_a)  # most were closed by timers in phase B
        # The open sessions are exactly phase B's, one per user, in the state.
        coordinator = WorkerResources.coordinator(config)
        backend = coordinator.restore_keyed(
            "sessions", key_group_range_for_operator(128, 1, 0), coordinator.checkpoint(),
            config.changelog())
        try:
            per_user = {s[0]: s[3] for s in expected_sessions(phase_b)}
            for user, count in per_user.items():
                backend.set_current_key(user.encode())
                assert backend.state(CLICKS).value() == count, user
            # Each reminder once (one per user and time), and every click counted by
            # exactly one reminder or still waiting for the next in the state.
            assert len({(user, at) for user, at, _ in reminders}) == len(reminders)
            reminded: dict[str, int] = {}
            for user, _, n in reminders:
                reminded[user] = reminded.get(user, 0) + n
            totals: dict[str, int] = {}
            for click in [*phase_a, *phase_b]:
                totals[click["user"]] = totals.get(click["user"], 0) + 1
            for user, total in totals.items():
                backend.set_current_key(user.encode())
                waiting = backend.state(SINCE_REMINDER).value() or 0
                assert reminded.get(user, 0) + waiting == total, (user, reminded.get(user),
                                                                 waiting)
            assert len(reminded) == len(totals)  # every user was reminded at least once
        finally:
            backend.close()
    finally:
        WorkerResources.release(config)
