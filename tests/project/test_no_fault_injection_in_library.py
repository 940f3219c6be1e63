"""Shipped code never kills its own process or reads a fault-injection variable, and
leaves the workers' Python to the user when they set it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [p for package in ("kafka_changelog", "spark_integration")
           for p in (ROOT / package).rglob("*.py")
           # The local Kafka stops the brokers it started, then dies of the SIGTERM that
           # stopped it; the test kit uses it.
           if not {"local_kafka", "testing"} & set(p.relative_to(ROOT).parts)]


def test_no_module_of_the_library_signals_its_own_process() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in SHIPPED
                 if re.search(r"os\.kill\(os\.getpid\(\)|signal\.raise_signal|os\.abort\(|"
                              r"CRASH_AT", p.read_text())]
    assert offenders == []


def test_stateful_foreach_batch_leaves_a_users_worker_python_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spark_integration.sessions.session import ensure_worker_python
    from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch

    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/cluster/python3")
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    config = StreamingStateConfig(application="a", operator_id="o",
                                  bootstrap_servers="localhost:9092")
    stateful_foreach_batch(config, lambda key, rows, state: [], "user", "user string")
    assert os.environ["PYSPARK_PYTHON"] == "/opt/cluster/python3"
    assert "PYSPARK_DRIVER_PYTHON" not in os.environ
    # The helper for local sessions fills in only what is unset.
    assert ensure_worker_python() == "/opt/cluster/python3"
    assert os.environ["PYSPARK_PYTHON"] == "/opt/cluster/python3"
