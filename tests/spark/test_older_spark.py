"""CI's share of the compatibility run for PySpark (``scripts/compat.sh spark`` runs more):
the version checks and the change feed, whose reader and streaming source meet what differs
most between releases (filter pushdown from 4.1, ``Trigger.AvailableNow`` in Python sources
from 4.2), on each supported release older than the installed one, in a virtualenv of its own
(``scripts/spark_venv.sh``, made once per machine), against a real broker and Spark."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kafka_changelog.local_kafka.process import die_with_parent
from spark_integration.sessions.spark_versions import TESTED_RELEASES, installed_version

pytestmark = [pytest.mark.broker, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
OLDER = [v for v in TESTED_RELEASES if v != installed_version()]
SHARE = ["tests/spark/test_spark_versions.py", "tests/spark/test_change_feed.py"]


@pytest.mark.parametrize("version", OLDER)
def test_the_change_feed_and_version_checks_pass_on_an_older_pyspark(version: str) -> None:
    made = subprocess.run(["scripts/spark_venv.sh", version], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200, preexec_fn=die_with_parent())
    assert made.returncode == 0, made.stderr[-3000:]
    python = Path(made.stdout.strip().splitlines()[-1])
    assert subprocess.run([python, "-c", "import pyspark; print(pyspark.__version__)"],
                          capture_output=True, text=True).stdout.strip() == version
    # The venv runs this clone's library wherever it is imported from (pytest imports it
    # through its plugin, before the clone is on the path; Spark's workers run elsewhere).
    where = "import kafka_changelog; print(kafka_changelog.__file__)"
    library = subprocess.run([python, "-c", where], capture_output=True, text=True,
                             cwd="/").stdout.strip()
    assert Path(library).is_relative_to(ROOT), (library, ROOT)
    # The nested run starts its own broker and Spark; the outer run's class archive is for
    # another Spark's jars (a JVM that cannot map it runs without it).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([python.parent / "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                           "-rs", *SHARE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200, preexec_fn=die_with_parent())
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, f"PySpark {version}:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert " failed" not in summary and " passed" in summary, summary
