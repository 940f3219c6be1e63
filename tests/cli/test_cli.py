"""The kafka-changelog console script against a real broker and real kcat."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog import KeyGroupRange
from kafka_changelog.kafka import KafkaChangelogHandle, KafkaChangelogStorage
from tests.kafka.kafka_helpers import storage_config

pytestmark = pytest.mark.broker


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_changelog.cli", *args],
        input=stdin.decode() if stdin else None, capture_output=True, text=True, timeout=120,
    )


@pytest.fixture(scope="module")
def persisted(kafka_cluster: Any) -> tuple[Any, KafkaChangelogHandle]:
    config = storage_config(kafka_cluster, partitions=2, max_parallelism=8)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "cli-op", KeyGroupRange.of(0, 7)
    ) as writer:
        writer.append_meta(b"meta")
        for kg in range(8):
            writer.append(kg, b"value-%d" % kg)
        writer.append(3, b"\xff\x00binary")
        handle = writer.persist(writer.initial_sequence_number(), 5).result(30).job_owned
    assert isinstance(handle, KafkaChangelogHandle)
    return config, handle


def test_inspect_from_file_and_base64(
    persisted: tuple[Any, KafkaChangelogHandle], tmp_path: Path
) -> None:
    _, handle = persisted
    path = tmp_path / "handle.bin"
    path.write_bytes(handle.to_bytes())
    from_file = cli("inspect", str(path))
    assert from_file.returncode == 0, from_file.stderr
    summary = json.loads(from_file.stdout)
    assert summary["log_id"] == handle.log_id
    assert summary["checkpoint_id"] == 5
    assert summary["key_groups"] == [0, 7]
    assert [r["partition"] for r in summary["ranges"]] == [0, 1]
    assert summary["ranges"][0]["key_groups"] == [0, 3]
    as_text = base64.b64encode(handle.to_bytes()).decode()
    assert json.loads(cli("inspect", as_text).stdout) == summary
    assert json.loads(cli("inspect", "-", stdin=as_text.encode()).stdout) == summary


def test_dump_prints_decoded_changes(persisted: tuple[Any, KafkaChangelogHandle]) -> None:
    config, handle = persisted
    result = cli("-b", config.bootstrap_servers, "dump",
                 base64.b64encode(handle.to_bytes()).decode())
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[0] == {"key_group": None, "meta": True, "payload_base64": "bWV0YQ==",
                        "payload_utf8": "meta"}
    assert [line.get("payload_utf8") for line in lines[1:9]] == [
        f"value-{kg}" for kg in range(8)]
    assert base64.b64decode(lines[9]["payload_base64"]) == b"\xff\x00binary"
    assert "payload_utf8" not in lines[9]


def test_kcat_commands_replay_the_records(persisted: tuple[Any, KafkaChangelogHandle]) -> None:
    config, handle = persisted
    result = cli("-b", config.bootstrap_servers, "kcat",
                 base64.b64encode(handle.to_bytes()).decode())
    assert result.returncode == 0, result.stderr
    commands = result.stdout.splitlines()
    assert len(commands) == 2
    replayed = [
        subprocess.run(shlex.split(c), capture_output=True, text=True, check=True,
                       timeout=60).stdout for c in commands
    ]
    assert all(f"key={handle.log_id}" in out for out in replayed)
    assert all("kc.schema=change_batch/2" in out for out in replayed)


def test_topics_validates(persisted: tuple[Any, KafkaChangelogHandle]) -> None:
    config, _ = persisted
    ok = cli("-b", config.bootstrap_servers, "topics", "--topic", config.topic,
             "--partitions", "2")
    assert ok.returncode == 0, ok.stderr
    shown = json.loads(ok.stdout)
    assert shown["partitions"] == 2
    assert shown["configs"]["cleanup.policy"] == "delete"
    too_few = cli("-b", config.bootstrap_servers, "topics", "--topic", config.topic,
                  "--partitions", "9")
    assert too_few.returncode == 2
    assert "has 2 partitions; expected at least 9" in too_few.stderr


def test_bad_handle_argument_is_a_clear_error() -> None:
    result = cli("inspect", "not-a-handle!")
    assert result.returncode == 2
    assert "neither a handle file nor base64 of a handle" in result.stderr
