"""The soak's checks of state and outputs against the model: with our reader (a restore in
this process), the CLI, and Spark's Kafka connector (``read_committed``)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from examples.clickstream import output_problems, outputs_with_spark, read_outputs
from spark_integration.streaming import StreamingStateConfig
from tests.spark.jobs import OPERATOR, REPO, state_of


def state_problems(config: StreamingStateConfig, expected: dict[str, dict[str, Any]]
                   ) -> list[str]:
    """How the state at the latest checkpoint differs from ``expected`` (restored here)."""
    found = state_of(config, sorted(expected))
    wrong = [user for user in expected if found[user] != expected[user]]
    return [f"state of {len(wrong)} users differs, e.g. {u}: {found[u]} != {expected[u]}"
            for u in wrong[:1]]


def outputs(config: StreamingStateConfig, topic: str) -> list[tuple[int, str, int, float]]:
    """The committed outputs of ``topic``."""
    return read_outputs({"bootstrap.servers": config.bootstrap_servers}, topic)


def all_problems(config: StreamingStateConfig, topic: str,
                 expected: dict[str, dict[str, Any]]) -> list[str]:
    """State and outputs against the model (empty: all right)."""
    return state_problems(config, expected) + output_problems(outputs(config, topic),
                                                              expected)


def cli_problems(config: StreamingStateConfig, expected: dict[str, dict[str, Any]],
                 users: list[str]) -> list[str]:
    """``kafka-changelog state`` of ``users`` and ``verify`` of the application."""
    base = [sys.executable, "-m", "kafka_changelog.cli", "-b", config.bootstrap_servers,
            "--checkpoint-topic", config.checkpoint_topic,
            "--changelog-topic", config.changelog_topic,
            "--snapshot-topic", config.snapshot_topic]
    problems = []
    for user in users:
        done = subprocess.run([*base, "state", config.application, "--operator", OPERATOR,
                               "--key", user, "--json"], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            problems.append(f"cli state {user}: exit {done.returncode}: {done.stderr[-500:]}")
            continue
        states = {s["state"]: s["value"] for s in json.loads(done.stdout)["states"]}
        want = expected[user]
        if (states.get("events"), states.get("spent")) != (want["events"], want["spent"]):
            problems.append(f"cli state {user}: {states} != {want}")
    done = subprocess.run([*base, "verify", config.application], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        problems.append(f"cli verify: exit {done.returncode}: {done.stdout[-500:]}"
                        f"{done.stderr[-500:]}")
    return problems


def spark_problems(spark: Any, config: StreamingStateConfig, topic: str) -> list[str]:
    """The outputs read with Spark's Kafka connector (``read_committed``) against ours."""
    ours = sorted(outputs(config, topic))
    theirs = sorted(tuple(row) for row in outputs_with_spark(
        spark, config.spark_kafka_options(), topic).collect())
    if theirs != ours:
        return [f"Spark's connector reads {len(theirs)} outputs, ours {len(ours)}"]
    return []


def restart_output_problems(rows: list[tuple[int, str, int, float]],
                            found: dict[str, dict[str, Any]], latest: int) -> list[str]:
    """The committed outputs against the state at checkpoint ``latest`` (taken while the
    job ran): no user's output twice in a checkpoint, and each user's last output up to
    ``latest`` shows its state then (outputs of a later checkpoint may be committed
    already: its subtasks committed, the driver not yet)."""
    problems = []
    pairs = [(checkpoint, user) for checkpoint, user, _, _ in rows]
    if len(pairs) != len(set(pairs)):
        problems.append(f"{len(pairs) - len(set(pairs))} outputs of a batch written twice")
    last = {user: (events, spent) for checkpoint, user, events, spent in sorted(rows)
            if checkpoint <= latest}
    wrong = [user for user, totals in last.items()
             if totals != (found[user]["events"], found[user]["spent"])]
    if wrong:
        problems.append(f"the last outputs up to checkpoint {latest} of {len(wrong)} users "
                        f"differ from their state, e.g. {wrong[0]}: {last[wrong[0]]}")
    return problems
