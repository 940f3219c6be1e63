"""Every Python example of README.md and of the Spark guides runs as a user would run it:
against ``kafka-changelog broker`` started in another process, each document's examples in
order in one fresh interpreter of its own, so each guide sets up what it uses (its session
first). docs/state.md and the other in-process documents run in ``test_docs_examples.py``."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


#: The documents whose examples run here, each in a fresh interpreter (one per line).
BROKER_DOCS = [
    "README.md",
    "docs/reading.md",
    "docs/streaming.md",
    "docs/writing-state.md",
    "docs/time.md",
    "docs/exactly-once.md",
    "docs/operations.md",
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``kafka-changelog broker --port P``, as the README says to start it."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "kafka_changelog.cli", "broker", "--port", str(port),
         "--data-dir", str(tmp_path_factory.mktemp("broker-data"))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert process.stdout is not None
    deadline = time.monotonic() + 300
    seen = []
    try:
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            seen.append(line)
            if "Kafka is up at" in line:
                break
            if not line and process.poll() is not None:
                break
        else:
            raise AssertionError("no 'Kafka is up' within 300 s:\n" + "".join(seen[-20:]))
        assert "Kafka is up at" in seen[-1], "".join(seen[-20:])
        yield f"127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(120) == 0
        finally:
            if process.poll() is None:
                process.kill()


@pytest.mark.parametrize("document", BROKER_DOCS)
def test_the_examples_run_against_kafka_changelog_broker(broker: str, document: str,
                                                         tmp_path: Path) -> None:
    blocks = BLOCK.findall((ROOT / document).read_text(encoding="utf-8"))
    assert blocks, document
    script = "\n\n".join(blocks).replace("localhost:9092", broker)
    # The examples' temporary directories (checkpointLocations) go with the test's.
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{document}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
