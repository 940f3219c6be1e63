"""Streaming with ``state_backend="rocksdb"``: a subtask's state is reattached from the host's
local state directory by whichever Python worker runs it next (new ones included) without
reading Kafka, stays exact across batches and rescaling, and the directory keeps only the
current store of each subtask."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kafka_changelog import KeyGroupRange
from kafka_changelog.state.host.local_store import SubtaskStore
from spark_integration.streaming import (
    StatefulProcessor,
    StreamingStateConfig,
    stateful_foreach_batch,
)
from spark_integration.streaming.worker_resources import WorkerResources

from .local_state_job import COUNT, PAGES, config_of, per_user

pytestmark = [pytest.mark.broker, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]


def make_batches(seed: int, count: int, size: int) -> list[list[list[str]]]:
    rng = random.Random(seed)
    return [[[f"u{rng.randrange(12)}", f"p{rng.randrange(4)}"] for _ in range(size)]
            for _ in range(count)]


class Model:
    """The query's state computed directly from the events."""

    def __init__(self) -> None:
        self.pages: dict[str, dict[str, int]] = {}

    def apply(self, rows: list[list[str]]) -> list[dict[str, Any]]:
        """The state after one batch, and the outputs it gives (sorted by user)."""
        for user, page in rows:
            counts = self.pages.setdefault(user, {})
            counts[page] = counts.get(page, 0) + 1
        return [{"user": u, "n": sum(self.pages[u].values()), "pages": len(self.pages[u])}
                for u in sorted({u for u, _ in rows})]


def sorted_outputs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(({"user": r["user"], "n": int(r["n"]), "pages": int(r["pages"])}
                   for r in rows), key=lambda r: r["user"])


def test_a_new_python_worker_reattaches_the_local_store_without_reading_kafka(
    kafka_cluster: Any, tmp_path: Path
) -> None:
    """Every task runs in a new Python process; after the first batch the changelog topic
    loses every record, so a restore from Kafka would fail: each later batch must find
    its subtask's store exactly at the checkpoint it starts from."""
    batches = make_batches(1, 4, 60)
    spec = {"bootstrap_servers": kafka_cluster.bootstrap_servers,
            "prefix": f"local-{uuid.uuid4().hex[:8]}", "local_state_dir": str(tmp_path / "state"),
            "parallelism": 2, "batches": batches, "first_batch_id": 0, "truncate_after": 0}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, "-m", "tests.spark.local_state_job",
                           str(tmp_path / "spec.json")], cwd=REPO, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 4
    model = Model()
    for line, rows in zip(lines, batches, strict=True):
        report = line["report"]
        assert sorted_outputs(line["outputs"]) == model.apply(rows)
        sources = {int(s): m["state_source"] for s, m in report["subtask_metrics"].items()}
        if report["batch_id"] == 0:
            assert sources == {0: "fresh", 1: "fresh"}
        else:
            assert sources == {0: "reattached-local", 1: "reattached-local"}
            assert report["restore_s"] == {}
            # Reattaching is opening a store: well under a second per subtask.
            assert all(m["attach_s"] < 2.0 for m in report["subtask_metrics"].values())
    # One store per subtask, each with its manifest at the last checkpoint.
    config = config_of(spec)
    stores = [SubtaskStore(config.local_state_root(), config.application, "op", s, 2)
              for s in range(2)]
    assert sorted(p.name for p in stores[0].operator_directory.iterdir()) == ["p2-s0", "p2-s1"]
    for store in stores:
        manifest = store.read_manifest()
        assert manifest is not None
        assert manifest.checkpoint_id == lines[-1]["report"]["checkpoint_id"]


def run_batches(spark: Any, processor: StatefulProcessor, batches: list[list[list[str]]],
                first_batch_id: int, model: Model) -> list[dict[int, str]]:
    """Run ``batches``; check each batch's outputs against the model; return the state
    sources of each batch by subtask."""
    sources = []
    for offset, rows in enumerate(batches):
        outputs: list[dict[str, Any]] = []
        processor.sink = lambda frame, _, into=outputs: into.extend(
            r.asDict() for r in frame.collect())
        processor(spark.createDataFrame(rows, "user string, page string"),
                  first_batch_id + offset)
        assert sorted_outputs(outputs) == model.apply(rows)
        report = processor.reports[-1]
        sources.append({s: m.state_source for s, m in report.subtask_metrics.items()})
    return sources


def test_state_stays_exact_across_batches_and_a_rescale(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    spec: dict[str, Any] = {"bootstrap_servers": kafka_cluster.bootstrap_servers,
                            "prefix": f"rescale-{uuid.uuid4().hex[:8]}",
                            "local_state_dir": str(tmp_path / "state"), "parallelism": 2}
    model = Model()
    batches = make_batches(2, 7, 50)
    config = config_of(spec)
    processor = stateful_foreach_batch(config, per_user, "user", "user string, n long, pages long")
    sources = run_batches(spark, processor, batches[:3], 0, model)
    assert sources[0] == {0: "fresh", 1: "fresh"}
    for batch in sources[1:]:  # the worker's own backend, or the store another one left
        assert set(batch.values()) <= {"reattached", "reattached-local"}
    root = config.local_state_root() / config.application / "op"
    assert sorted(p.name for p in root.iterdir()) == ["p2-s0", "p2-s1"]

    rescaled = config_of({**spec, "parallelism": 3})
    with stateful_foreach_batch(rescaled, per_user, "user",
                                "user string, n long, pages long") as three:
        sources = run_batches(spark, three, batches[3:6], 3, model)
        assert sources[0] == {0: "restored", 1: "restored", 2: "restored"}
        for batch in sources[1:]:
            assert set(batch.values()) <= {"reattached", "reattached-local"}
        # The stores of parallelism 2 are gone: one store per current subtask.
        assert sorted(p.name for p in root.iterdir()) == ["p3-s0", "p3-s1", "p3-s2"]
        # The state in Kafka is the model's, read back by a restore of everything.
        coordinator = WorkerResources.coordinator(rescaled)
        backend = coordinator.restore_keyed("op", KeyGroupRange(0, 127),
                                            coordinator.checkpoint())
        for user, pages in model.pages.items():
            backend.set_current_key(user.encode())
            assert backend.state(COUNT).value() == sum(pages.values())
            assert dict(backend.state(PAGES).items()) == pages
        backend.close()
    # Closing the processor deletes the operator's stores on this host.
    assert not root.exists()
    processor.close()


def test_a_failed_batch_is_rolled_back_from_the_copy_kept_at_its_base(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    """A batch whose function fails changed the stores after their checkpoint: the retry
    rolls each store back to the copy kept at the checkpoint it starts from (no Kafka
    read), and the state is as if the failed batch never ran."""
    spec = {"bootstrap_servers": kafka_cluster.bootstrap_servers,
            "prefix": f"fail-{uuid.uuid4().hex[:8]}",
            "local_state_dir": str(tmp_path / "state"), "parallelism": 2}
    config = config_of(spec)
    model = Model()
    batches = make_batches(3, 2, 40)
    failing = {"on": False}

    def fn(key: str, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
        produced = per_user(key, rows, state)
        if failing["on"] and key == "u3":
            raise RuntimeError("the function fails")
        return produced

    assert "u3" in {user for user, _ in batches[1]}
    with stateful_foreach_batch(config, fn, "user", "user string, n long, pages long") as p:
        run_batches(spark, p, batches[:1], 0, model)
        failing["on"] = True
        with pytest.raises(Exception, match="the function fails"):
            p(spark.createDataFrame(batches[1], "user string, page string"), 1)
        failing["on"] = False
        sources = run_batches(spark, p, batches[1:], 1, model)
        # The subtask that failed left its store changed, the other one at a checkpoint
        # that never completed: both roll back, nothing is restored from Kafka.
        assert sources[0] == {0: "rolled-back", 1: "rolled-back"}
        assert p.reports[-1].restore_s == {}
        stores = [SubtaskStore(config.local_state_root(), config.application, "op", s, 2)
                  for s in range(2)]
        # Each store keeps two copies: of the base it started from and of the checkpoint
        # it is at now (the next task keeps only its base's).
        for store in stores:
            assert store.retained_checkpoints() == [p.reports[0].checkpoint_id,
                                                    p.reports[-1].checkpoint_id]


def test_the_default_local_state_directory_is_the_users_own() -> None:
    import os
    import stat
    import tempfile

    config = StreamingStateConfig(application="app", operator_id="op",
                                  bootstrap_servers="127.0.0.1:9", parallelism=1)
    root = config.local_state_root()
    assert root == Path(tempfile.gettempdir()) / f"kafka-changelog-state-{os.getuid()}"
    assert root.is_dir() and root.stat().st_uid == os.getuid()
    assert stat.S_IMODE(root.stat().st_mode) & 0o077 == 0  # no one else's to read or write
    explicit = StreamingStateConfig(application="app", operator_id="op",
                                    bootstrap_servers="127.0.0.1:9", parallelism=1,
                                    local_state_dir="/mnt/ssd/state")
    assert explicit.local_state_root() == Path("/mnt/ssd/state")
