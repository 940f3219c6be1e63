"""The main job (the README's first command) runs end to end, reduced in size."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest

from kafka_changelog.local_kafka.process import die_with_parent

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def run_demo(kafka_cluster: Any, *extra: str) -> str:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_cluster.bootstrap_servers}
    done = subprocess.run(
        [sys.executable, "-m", "examples.streaming_demo", "--events", "900", "--users", "40",
         "--per-batch", "300", *extra],
        env=env, capture_output=True, text=True, timeout=900, preexec_fn=die_with_parent(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for job in ("clickstream", "sessions"):
        assert f"killed the examples.{job} driver (kill -9)" in done.stdout
    assert "state of all 40 users equals the state computed from the events" in done.stdout
    # Every session of the clicks, closed ones written exactly once (most by timers).
    assert re.search(r"sessions: \d+ closed .* 1 open in the state: exactly the \d+ "
                     r"sessions of the clicks", done.stdout), done.stdout[-3000:]
    fired = re.search(r"run 2 fired (\d+) event-time timers", done.stdout)
    assert fired is not None and int(fired.group(1)) >= 40, done.stdout[-3000:]
    assert "=== kafka-changelog streaming demo ===" in done.stdout
    return done.stdout


def test_demo_kills_restarts_rescales_and_checks_state(kafka_cluster: Any) -> None:
    out = run_demo(kafka_cluster)
    assert "spark               local[2], then local[3]" in out


def test_the_demo_hands_its_spark_to_both_query_runs() -> None:
    # The query runs with --master on the standalone cluster in the crash test; the demo
    # only passes its master and settings on (a full demo on the cluster costs ~3 minutes).
    from examples.streaming_demo import Spark, job_command

    command = job_command("127.0.0.1:9092", "run", "/tmp/chk", 3, 100, 10,
                          Spark("spark://127.0.0.1:7077", {"spark.cores.max": "2"}))
    assert command[-4:] == ["--master", "spark://127.0.0.1:7077",
                            "--spark-conf", "spark.cores.max=2"]
    assert "--master" not in job_command("127.0.0.1:9092", "run", "/tmp/chk", 3, 100, 10)
