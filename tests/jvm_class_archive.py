"""A class-data-sharing archive of Spark's classes for every Spark JVM of the tests.

A Spark driver loads some twenty thousand classes before its first job; parsing and
verifying them is a third of a short test driver's CPU (measured: a ``local[2]`` session
with one job, 12 CPU-s without the archive, 8 with it). The suite starts dozens of drivers
(subprocess drivers of the kill tests, the docs' examples, standalone executors, Connect
servers) on two cores, so the archive is made once per machine (cached by the Java and
PySpark it was made with) and named in ``JAVA_TOOL_OPTIONS``. A JVM whose class path does
not match (a Kafka broker) maps nothing and runs as before; its CDS messages are off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kafka_changelog.local_kafka.class_archive import QUIET_OPTIONS, jar_fingerprints, keep_newest
from kafka_changelog.local_kafka.maven import cache_root

#: Runs one small batch job, an Arrow round trip through a Python UDF and one streaming
#: batch: the classes every test driver loads before its own work.
_WORKLOAD = """
import sys, tempfile, pandas as pd
from pyspark import SparkContext
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())
frame = spark.createDataFrame(pd.DataFrame({"user": ["a", "b"], "n": [1, 2]}))
frame.groupBy("user").count().collect()
frame.mapInPandas(lambda batches: batches, frame.schema).toPandas()
with tempfile.TemporaryDirectory() as directory:
    with open(f"{directory}/0.json", "w") as handle:
        handle.write('{"user": "a"}\\n')
    query = (spark.readStream.schema("user string").json(directory).writeStream
             .foreachBatch(lambda batch, batch_id: batch.count())
             .option("checkpointLocation", f"{directory}/checkpoint")
             .trigger(availableNow=True).start())
    query.awaitTermination()
jvm = SparkContext._gateway.proc
spark.stop()
jvm.stdin.close()  # the JVM exits, writing the archive; wait for it
jvm.wait(240)
"""

#: Unified-logging tags the archive's users would print on (to stdout) when it does not
#: fit their class path.
QUIET = " ".join(QUIET_OPTIONS)


def _key(jvm_options: str) -> str:
    import pyspark

    java = shutil.which("java") or "java"
    version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    jars = Path(pyspark.__file__).parent / "jars"
    listing = jar_fingerprints(jars) if jars.is_dir() else []
    text = "\n".join([os.path.realpath(java), version, str(jars), *listing, jvm_options])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Archives kept per machine: each clone's virtualenv (its own PySpark path) needs its own,
#: and each is ~160 MB.
KEPT_ARCHIVES = 3


def spark_class_archive(jvm_options: str) -> Path | None:
    """The archive for JVMs run with ``jvm_options``, made first if missing; None when it
    cannot be made (the tests then run without it, only slower)."""
    directory = cache_root() / "jvm"
    archive = directory / f"spark-{_key(jvm_options)}.jsa"
    if archive.exists():
        return archive
    directory.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name and renamed: a JVM never maps half an archive.
    partial = Path(tempfile.mkdtemp(dir=directory)) / "spark.jsa"
    env = {**os.environ,
           "JAVA_TOOL_OPTIONS": f"{jvm_options} -XX:ArchiveClassesAtExit={partial} {QUIET}",
           "PYSPARK_PYTHON": sys.executable}
    try:
        subprocess.run([sys.executable, "-c", _WORKLOAD], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        if partial.exists():
            os.replace(partial, archive)
            keep_newest(directory, "spark-*.jsa", KEPT_ARCHIVES)
    except (subprocess.SubprocessError, OSError):
        return None
    finally:
        shutil.rmtree(partial.parent, ignore_errors=True)
    return archive if archive.exists() else None
