"""The Spark standalone harness: a daemon that cannot start is named with its log, and
nothing of the cluster is left behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.spark.standalone import TAG_PROPERTY, LocalSparkCluster, SparkClusterError


def tagged_processes(root: str) -> list[int]:
    """Processes carrying the cluster tag of ``root`` in their command line."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"-D{TAG_PROPERTY}={root} " in f"{text} ":
            found.append(int(cmdline.parent.name))
    return found


def test_a_worker_that_cannot_start_is_named_with_its_log_and_nothing_is_left() -> None:
    cluster = LocalSparkCluster(workers=1, worker_memory="plenty", startup_timeout=60)
    with pytest.raises(SparkClusterError) as caught:
        cluster.start()
    text = str(caught.value)
    assert "the Spark worker 0 of" in text and "exited with code" in text, text
    assert "=== worker 0 (" in caught.value.log_tail
    assert "Usage: Worker" in caught.value.log_tail  # it refused its --memory argument
    found = re.search(r"=== master \((/\S+)/spark-master/daemon\.log\)", caught.value.log_tail)
    assert found is not None, caught.value.log_tail
    root = found.group(1)
    assert not Path(root).exists()
    assert tagged_processes(root) == []
    assert repr(cluster) == "LocalSparkCluster(workers=1, stopped)"
