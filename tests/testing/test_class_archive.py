"""The local nodes map a class-data-sharing archive of their release's classes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kafka_changelog.local_kafka import class_archive
from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from kafka_changelog.local_kafka.jvm import FAST_START_FLAGS, find_java


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


@pytest.mark.broker
def test_nodes_map_the_archive_their_release_made() -> None:
    with LocalKafkaCluster(nodes=1) as cluster:
        java, jars = find_java(), cluster._jars
        archive = class_archive.archive_path(java, jars, FAST_START_FLAGS)
        assert archive.exists()
        node = cluster._nodes[0].process
        assert node is not None
        assert f"-XX:SharedArchiveFile={archive}" in _cmdline(node.pid)
    # -Xshare:on makes a JVM that cannot map it (another Java, half a file, another
    # class path) fail instead of running without it.
    mapped = subprocess.run([java, "-Xshare:on", f"-XX:SharedArchiveFile={archive}",
                             "-cp", f"{jars}/*", "-version"], capture_output=True, text=True)
    assert mapped.returncode == 0, mapped.stdout + mapped.stderr
    elsewhere = subprocess.run([java, "-Xshare:on", f"-XX:SharedArchiveFile={archive}",
                                "-cp", str(archive.parent), "-version"], capture_output=True)
    assert elsewhere.returncode != 0


@pytest.mark.broker
def test_without_the_archive_nodes_get_no_archive_option() -> None:
    with LocalKafkaCluster(nodes=1, class_archive=False) as cluster:
        node = cluster._nodes[0].process
        assert node is not None
        assert not [a for a in _cmdline(node.pid) if "SharedArchiveFile" in a]


def test_an_archive_is_renamed_into_place_only_when_its_node_wrote_it(tmp_path: Path) -> None:
    archive = tmp_path / "classes-x.jsa"

    def fails(options: list[str]) -> None:
        raise RuntimeError("the node did not start")

    assert class_archive.ensure_archive(archive, find_java(), fails) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classes-x.lock"]

    def writes(options: list[str]) -> None:
        assert options[0] == f"-XX:SharedArchiveFile={class_archive.base_archive(find_java())}"
        assert options[2:] == list(class_archive.QUIET_OPTIONS)
        Path(options[1].split("=", 1)[1]).write_bytes(b"archive")

    assert class_archive.ensure_archive(archive, find_java(), writes) is True
    assert archive.read_bytes() == b"archive"
    assert class_archive.ensure_archive(archive, find_java(), fails) is True  # made once


def test_while_one_process_makes_it_the_others_go_on_without(tmp_path: Path) -> None:
    archive = tmp_path / "classes-x.jsa"
    called = []
    with class_archive._only_one_maker(archive.with_suffix(".lock")) as first:
        assert first
        # Another process (a lock on another open file of the same path).
        assert class_archive.ensure_archive(archive, find_java(), called.append) is False
    assert called == []
