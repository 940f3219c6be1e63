"""``rewind``: a dry run writes nothing, ``--yes`` makes the checkpoint the latest again
(the checkpoints after it and the chunks only they use go), a second run finishes an
interrupted rewind, a checkpoint not retained and a live application are refused, and
another application on the same topics keeps exactly its state."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kafka_changelog.cli.main import main
from kafka_changelog.kafka import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.checkpoints.checkpoint_store import checkpoint_key
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.history.rewind import REWOUND_FROM_PROPERTY, plan_rewind

from .cli_helpers import (
    COUNT,
    MAX_P,
    Deployment,
    Operator,
    Topics,
    chunk_keys,
    cli,
    end_offsets,
    kg,
    last_records,
    ranges,
    stored_checkpoints,
)

pytestmark = pytest.mark.broker

HOUR_MS = 3_600_000
USERS = [f"u-{i}".encode() for i in range(8)]


def counts_work(backend: ChangelogKeyedStateBackend, key_groups: Any, round_: int,
                model: dict[bytes, Any]) -> None:
    """count = round * 100 + i; from round 2 on the first user's count is cleared."""
    for i, user in enumerate(USERS):
        if not key_groups.contains(kg(user)):
            continue
        backend.set_current_key(user)
        if round_ >= 2 and i == 0:
            backend.state(COUNT).clear()
            model.pop(user, None)
        else:
            backend.state(COUNT).update(round_ * 100 + i)
            model[user] = round_ * 100 + i


@dataclass
class Shared:
    """alpha and gamma (stopped an hour ago: checkpoints 1..4, materialized at 1 and 3;
    retention kept 2..4) and beta (checkpoints 1, 2 just now) on the same topics."""

    cluster: Any
    topics: Topics
    deployments: dict[str, Deployment]
    checkpoints: dict[str, list[CompletedCheckpoint]]
    #: Per application, the model after each round.
    models: dict[str, list[dict[bytes, Any]]]

    def args(self, *args: str) -> list[str]:
        return [*self.topics.cli_args(self.cluster), *args]

    def state(self, application: str) -> dict[bytes, Any]:
        """Every user's count at the application's latest checkpoint (restored)."""
        deployment = self.deployments[application]
        latest = deployment.coordinator.checkpoint()
        found = {}
        for key_groups in ranges(2):
            backend = deployment.coordinator.restore_keyed("counts", key_groups, latest,
                                                           deployment.changelog)
            try:
                for user in USERS:
                    if key_groups.contains(kg(user)):
                        backend.set_current_key(user)
                        value = backend.state(COUNT).value()
                        if value is not None:
                            found[user] = value
            finally:
                backend.close()
        return found


def _run(deployment: Deployment, rounds: int, start_ms: int) -> tuple[
        list[CompletedCheckpoint], list[dict[bytes, Any]]]:
    operator = Operator(2, counts_work)
    checkpoints, models = [], []
    for round_ in range(1, rounds + 1):
        checkpoints.append(deployment.run_round(round_, {"counts": operator}, round_,
                                                start_ms + round_, materialize=round_ in (1, 3)))
        models.append(dict(operator.model))
    return checkpoints, models


@pytest.fixture(scope="module")
def shared(kafka_cluster: Any) -> Iterator[Shared]:
    topics = Topics.fresh()
    old = int(time.time() * 1000) - HOUR_MS
    deployments = {name: Deployment(kafka_cluster, name, topics)
                   for name in ("alpha", "gamma", "beta")}
    try:
        runs = {"alpha": _run(deployments["alpha"], 4, old),
                "gamma": _run(deployments["gamma"], 4, old),
                "beta": _run(deployments["beta"], 2, int(time.time() * 1000))}
        yield Shared(kafka_cluster, topics, deployments,
                     {name: run[0] for name, run in runs.items()},
                     {name: run[1] for name, run in runs.items()})
    finally:
        for deployment in deployments.values():
            deployment.close()


def test_a_dry_run_writes_nothing_and_yes_rewinds_leaving_others_alone(
    shared: Shared, capsys: pytest.CaptureFixture[str],
) -> None:
    topics = shared.topics
    before = end_offsets(shared.cluster, topics.all())
    beta_state = shared.state("beta")
    assert beta_state == shared.models["beta"][-1]

    alpha = shared.checkpoints["alpha"]
    # Checkpoints 3 and 4 have materialization 3's snapshot: what only it adds goes.
    third = chunk_keys(alpha[2:3]) - chunk_keys(alpha[:2])
    assert third
    dry = cli(*shared.args("rewind", "alpha", "--to", "2"))
    assert dry.returncode == 1, dry.stderr
    assert dry.stdout.splitlines() == [
        f"application alpha (checkpoint topic {topics.checkpoint}):",
        "  would rewind to checkpoint 2: its copy is checkpoint 6, the latest (was 4)",
        "  would discard checkpoints: 3, 4",
        f"  would delete snapshot chunks only they use: {len(third)} in {topics.snapshot}",
        "  startingOffsets: (not recorded)"]
    assert "kafka-changelog: dry run: nothing written; pass --yes to rewind" in dry.stderr
    assert main(shared.args("rewind", "alpha", "--to", "2", "--json")) == 1
    assert json.loads(capsys.readouterr().out) == {
        "application": "alpha", "checkpoint_topic": topics.checkpoint, "to": 2,
        "latest_before": 4, "new_latest": 6, "finishing": False, "discard": [3, 4],
        "snapshot_chunks": {topics.snapshot: len(third)}, "starting_offsets": None,
        "rewound": False, "refused": "dry run: nothing written; pass --yes to rewind"}

    missing = cli(*shared.args("rewind", "alpha", "--to", "9", "--yes"))
    assert missing.returncode == 2
    assert missing.stderr == (
        "kafka-changelog: error: cannot rewind application 'alpha' to checkpoint 9: it is "
        "newer than the latest checkpoint; retained checkpoints: 2, 3, 4 (every stored "
        "checkpoint counts as retained)\n")
    beyond = cli(*shared.args("rewind", "alpha", "--to", "2", "--yes", "--retain", "2"))
    assert beyond.returncode == 2
    assert beyond.stderr == (
        "kafka-changelog: error: cannot rewind application 'alpha' to checkpoint 2: it is "
        "beyond retention and being garbage collected; retained checkpoints: 3, 4 "
        "(retain=2, retain_for_s=None)\n")
    live = cli(*shared.args("rewind", "beta", "--to", "1", "--yes", "--alive-within", "3600"))
    assert live.returncode == 1
    assert re.search(r"kafka-changelog: application 'beta' looks alive: its latest "
                     r"checkpoint 2 is [0-9ms]+ old \(--alive-within 3600 s\); stop it first, "
                     r"or pass --force", live.stderr), live.stderr
    assert end_offsets(shared.cluster, topics.all()) == before  # nothing written

    done = cli(*shared.args("rewind", "alpha", "--to", "2", "--yes"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        line.replace("would rewind", "rewound").replace("would discard", "discarded")
        .replace("would delete", "deleted") for line in dry.stdout.splitlines()]
    stored = stored_checkpoints(shared.cluster, topics, "alpha")
    # (Checkpoint 1 went by retention, retain=3, at the commit of 4.)
    assert [cp.checkpoint_id for cp in stored] == [2, 6]
    two = shared.checkpoints["alpha"][1]
    assert stored[1].subtasks == two.subtasks and stored[1].log_floors == two.log_floors
    assert stored[1].properties[REWOUND_FROM_PROPERTY] == "2"
    records = last_records(shared.cluster, topics.checkpoint)
    assert records[checkpoint_key("alpha", 3).encode()] is None
    assert records[checkpoint_key("alpha", 4).encode()] is None
    chunks = last_records(shared.cluster, topics.snapshot)
    assert all(chunks[key] is None for key in third)
    assert all(chunks[key] is not None for key in chunk_keys(stored))
    assert shared.state("alpha") == shared.models["alpha"][1]
    # The others on the same topics: untouched, and still restore exactly.
    assert shared.state("beta") == beta_state
    assert shared.state("gamma") == shared.models["gamma"][-1]
    # The next checkpoint continues after the copy, from its state.
    shared.deployments["alpha"].run_round(7, {"counts": Operator(2, counts_work)}, 5,
                                          int(time.time() * 1000), materialize=False)
    assert shared.state("alpha") == {u: 500 + i for i, u in enumerate(USERS) if i}


def test_an_interrupted_rewind_is_finished_by_a_second_run(shared: Shared) -> None:
    store = shared.deployments["gamma"].checkpoints
    plan = plan_rewind(store, "gamma", 3)
    assert plan.copy is not None
    store.commit(plan.copy)  # the first write only: the process died there
    assert shared.state("gamma") == shared.models["gamma"][2]
    assert [cp.checkpoint_id for cp in stored_checkpoints(
        shared.cluster, shared.topics, "gamma")] == [2, 3, 4, 6]

    second = cli(*shared.args("rewind", "gamma", "--to", "3", "--yes"))
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == [
        f"application gamma (checkpoint topic {shared.topics.checkpoint}):",
        "  finished the interrupted rewind to checkpoint 3 (its copy 6 is the latest)",
        "  discarded checkpoints: 4",
        "  deleted snapshot chunks only they use: none",
        "  startingOffsets: (not recorded)"]
    assert [cp.checkpoint_id for cp in stored_checkpoints(
        shared.cluster, shared.topics, "gamma")] == [2, 3, 6]
    assert shared.state("gamma") == shared.models["gamma"][2]
    again = cli(*shared.args("rewind", "gamma", "--to", "3", "--yes"))
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[1] == (
        "  checkpoint 6 holds the state of checkpoint 3 and is the latest: nothing to do")


def test_garbage_collection_keeps_the_count_and_what_is_younger_than_the_age(
    shared: Shared,
) -> None:
    deployment = Deployment(shared.cluster, "delta", shared.topics)
    try:
        settings = dict(shared.cluster.client_config())
        deployment.checkpoints.close()
        deployment.checkpoints = KafkaCheckpointStore(CheckpointStoreConfig(
            bootstrap_servers=settings.pop("bootstrap.servers"), client_config=settings,
            topic=shared.topics.checkpoint, retain=2, retain_for_s=3600))
        deployment.coordinator = CheckpointCoordinator(
            "delta", deployment.checkpoints, deployment.snapshots, deployment.storage, MAX_P)
        now = int(time.time() * 1000)
        operator = Operator(2, counts_work)
        committed = [deployment.run_round(i, {"counts": operator}, i, now - minutes * 60_000,
                                          materialize=True)
                     for i, minutes in enumerate([180, 120, 30, 20, 10], start=1)]
        # Beyond the newest two (4, 5): 1 and 2 are older than an hour and went; 3 is not.
        assert deployment.coordinator.last_garbage.discarded_checkpoints == [2]
        assert [cp.checkpoint_id for cp in stored_checkpoints(
            shared.cluster, shared.topics, "delta")] == [3, 4, 5]
        gone = chunk_keys(committed[:2]) - chunk_keys(committed[2:])
        chunks = last_records(shared.cluster, shared.topics.snapshot)
        assert gone and all(chunks[key] is None for key in gone)
        assert all(chunks[key] is not None for key in chunk_keys(committed[2:]))
        # Rewinding to a checkpoint kept by age only.
        plan = plan_rewind(deployment.checkpoints, "delta", 3)
        assert (plan.target_id, plan.discard) == (3, (4, 5))
    finally:
        deployment.close()


def test_bad_retention_options_are_refused_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In this process (no broker is asked): nothing listens at port 1.
    assert main(["-b", "127.0.0.1:1", "rewind", "app", "--to", "1", "--retain-for", "60"]) == 2
    assert capsys.readouterr().err == (
        "kafka-changelog: error: --retain-for needs --retain (the application's retain)\n")
    assert main(["-b", "127.0.0.1:1", "rewind", "app", "--to", "1", "--retain", "1"]) == 2
    assert capsys.readouterr().err == (
        "kafka-changelog: error: retain must be at least 2 (the latest checkpoint and the "
        "one before it), got 1\n")
