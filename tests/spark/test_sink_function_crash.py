"""The sink-function path (at least once) through driver kills: exactly-once state, and
outputs exactly once once de-duplicated by checkpoint id, as docs/streaming.md tells users.

The clickstream job writes its outputs with a sink function that keeps each call's
outputs under its checkpoint id (``tests.spark.crashing_clickstream --sink-dir``). The
driver is killed before the checkpoint commit of one batch, then right after the sink's
call for a later batch (after the commit, before Spark's): the re-run processes that
batch again and calls the sink again with the same checkpoint id (at least once).
"""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from examples.clickstream import expected_state, output_problems, produce_events
from examples.events import events
from spark_integration.streaming.worker_resources import WorkerResources

from .jobs import Job, state_of

pytestmark = [pytest.mark.broker, pytest.mark.spark]

EVENT_COUNT = 1200
USERS = 30
PER_BATCH = 300


def sink_outputs(sink_dir: Path) -> list[tuple[int, str, int, float]]:
    """Every checkpoint's outputs, one file each (a re-run replaced its file)."""
    return [(int(path.stem), user, events_, spent)
            for path in sorted(sink_dir.glob("*.json"))
            for user, events_, spent in json.loads(path.read_text())]


def test_sink_function_outputs_are_exactly_once_by_checkpoint_id(
        kafka_cluster: Any, tmp_path: Path) -> None:
    job = Job(f"csf-{uuid.uuid4().hex[:8]}", kafka_cluster.bootstrap_servers,
              tmp_path / "spark-checkpoint", EVENT_COUNT, per_batch=PER_BATCH)
    produce_events(kafka_cluster.client_config(), job.input_topic, EVENT_COUNT, USERS)
    sink_dir = tmp_path / "sink"
    sink_dir.mkdir()
    done = job.run(2, "before_commit:1", sink_dir=sink_dir)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    done = job.run(2, sink_dir=sink_dir, kill_after_sink=2)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    assert (sink_dir / "killed").exists()
    done = job.run(2, sink_dir=sink_dir)
    assert done.returncode == 0, done.stderr[-3000:]

    calls = [tuple(map(int, line.split()))
             for line in (sink_dir / "calls.log").read_text().splitlines()]
    # At least once: the batch whose driver died after the sink's call was sent again,
    # under the same checkpoint id.
    again = [call for call, count in Counter(calls).items() if count > 1]
    assert [batch for _, batch in again] == [2], calls
    # De-duplicated by checkpoint id, the outputs are exactly the expected ones.
    expected = expected_state(events(EVENT_COUNT, USERS))
    outputs = sink_outputs(sink_dir)
    assert output_problems(outputs, expected) == []
    assert len({checkpoint for checkpoint, *_ in outputs}) >= 4
    config = job.config()
    assert state_of(config, sorted(expected)) == expected
    WorkerResources.release(config)
