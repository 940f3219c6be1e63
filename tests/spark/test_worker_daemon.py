"""Spark's Python workers fork from a daemon that imported the library already."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from spark_integration.sessions.worker_daemon import PRELOADED, WORKER_DAEMON, installed_copies

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


def _where_pyspark_comes_from(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    import gc

    import pyspark
    for _ in batches:
        pass
    zips = [entry for entry in sys.path if entry.endswith(".zip") and "pyspark" in entry]
    yield pd.DataFrame({"module": [pyspark.__file__], "zips": [",".join(zips)],
                        "frozen": [gc.get_freeze_count() > 50_000]})


def test_workers_import_the_installed_pyspark_and_collect_only_their_own_objects(
        spark: Any) -> None:
    import pyspark
    rows = (spark.range(2, numPartitions=2)
            .mapInPandas(_where_pyspark_comes_from, "module string, zips string, frozen boolean")
            .collect())
    # Compiled once and cached, not compiled from the zip at every daemon start; the
    # daemon's preloaded objects are out of the collector's sight in its workers.
    assert [(row.module, row.zips, row.frozen) for row in rows] == [
        (pyspark.__file__, "", True)] * 2


def test_only_the_zips_inside_the_installed_package_are_dropped(tmp_path: Any) -> None:
    site = tmp_path / "site-packages"
    for package in ("pyspark", "py4j"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").touch()
    inside = site / "pyspark" / "python" / "lib"
    other_home = tmp_path / "spark-4.2.0" / "python" / "lib"
    path = [str(inside / "pyspark.zip"), str(inside / "py4j-0.10.9.9-src.zip"),
            str(other_home / "pyspark.zip"), str(other_home / "py4j-0.10.9.9-src.zip"),
            str(site)]
    assert installed_copies(path) == path[:2]
    # Without the installed package on the path, Spark's copies are all there is.
    assert installed_copies(path[:4]) == []
