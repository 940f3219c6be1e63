"""The suite's Spark JVMs map the class archive the suite made (tests/jvm_class_archive.py)."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_the_spark_driver_of_the_tests_can_map_the_archive(spark: Any) -> None:
    options = os.environ["JAVA_TOOL_OPTIONS"]
    found = re.search(r"-XX:SharedArchiveFile=(\S+)", options)
    assert found, options
    archive = found.group(1)
    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                     .getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in arguments
    # -Xshare:on fails where the archive cannot be mapped (a class path it was not made
    # for, another Java, half a file) instead of running without it.
    class_path = jvm.java.lang.System.getProperty("java.class.path")
    env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
    java = f"{jvm.java.lang.System.getProperty('java.home')}/bin/java"
    mapped = subprocess.run([java, "-Xshare:on",
                             f"-XX:SharedArchiveFile={archive}", "-cp", class_path, "-version"],
                            capture_output=True, text=True, env=env)
    assert mapped.returncode == 0, mapped.stdout + mapped.stderr
