"""The main job (the README's first command) runs end to end, reduced in size."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def test_demo_kills_restarts_rescales_and_checks_state(kafka_cluster: Any) -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_cluster.bootstrap_servers}
    done = subprocess.run(
        [sys.executable, "-m", "spark_integration.demo", "--events", "1500", "--users", "40",
         "--per-batch", "300"],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "killed the driver (kill -9)" in done.stdout
    assert "state of all 40 users equals the state computed from the events" in done.stdout
    assert "=== kafka-changelog streaming demo ===" in done.stdout
