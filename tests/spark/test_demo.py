"""The main job (the README's first command) runs end to end, reduced in size: in
``local[n]`` (the default) and on a Spark standalone cluster (``--master``)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from kafka_changelog.testing.process import die_with_parent

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def run_demo(kafka_cluster: Any, *extra: str) -> str:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_cluster.bootstrap_servers}
    done = subprocess.run(
        [sys.executable, "-m", "spark_integration.demo", "--events", "1500", "--users", "40",
         "--per-batch", "300", *extra],
        env=env, capture_output=True, text=True, timeout=900, preexec_fn=die_with_parent(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "killed the driver (kill -9)" in done.stdout
    assert "state of all 40 users equals the state computed from the events" in done.stdout
    assert "=== kafka-changelog streaming demo ===" in done.stdout
    return done.stdout


def test_demo_kills_restarts_rescales_and_checks_state(kafka_cluster: Any) -> None:
    out = run_demo(kafka_cluster)
    assert "spark               local[2], then local[3]" in out


@pytest.mark.spark_cluster
def test_demo_runs_on_a_standalone_cluster(kafka_cluster: Any, spark_cluster: Any) -> None:
    apps = len(spark_cluster.status()["completedapps"])
    out = run_demo(kafka_cluster, "--master", spark_cluster.master_url)
    assert f"spark               {spark_cluster.master_url}" in out
    # Both query runs and the final read were applications of the cluster.
    assert len(spark_cluster.status()["completedapps"]) - apps == 3
