"""Spark's Python workers fork from a daemon that imported the library already."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from spark_integration.sessions.worker_daemon import PRELOADED, WORKER_DAEMON

pytestmark = pytest.mark.spark


def test_preloading_imports_everything_and_starts_no_thread_and_prints_nothing() -> None:
    # A fork keeps only the forking thread, and the daemon's standard output is where it
    # tells Spark its port: both would break every worker.
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys, threading\n"
         "from spark_integration.sessions.worker_daemon import preload\n"
         "missing = preload()\n"
         "sys.stderr.write(f'{missing} {threading.active_count()}')"],
        capture_output=True, text=True, check=True)
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1] == "[] 1"


def _imported_before_the_task(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    already = [name for name in PRELOADED if name in sys.modules]
    for _ in batches:
        pass
    yield pd.DataFrame({"module": already})


def test_workers_of_the_librarys_sessions_start_with_it_imported(spark: Any) -> None:
    assert spark.conf.get("spark.python.daemon.module") == WORKER_DAEMON
    rows = (spark.range(4, numPartitions=2)
            .mapInPandas(_imported_before_the_task, "module string").collect())
    # Every worker (one per partition) found every preloaded module imported.
    assert sorted(row.module for row in rows) == sorted(PRELOADED * 2)
