#!/usr/bin/env bash
# Installs what the tests need (scripts/setup.sh test), then runs lint, type checks and the
# whole test suite against real Kafka brokers that the tests start and stop themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh test
echo "[test] ruff"
.venv/bin/ruff check .
echo "[test] mypy"
.venv/bin/mypy
echo "[test] pytest"
brokers() { pgrep -f 'kafka-changelog.*kafka\.Kafka' | sort || true; }
# Spark standalone masters, workers and executors of the tests carry this tag; Python workers
# are PySpark daemons.
spark_processes() { pgrep -f 'kafka-changelog-spark-cluster|pyspark\.daemon' | sort || true; }
# The container tests need Docker: the fixtures start dockerd (as root) and build the images
# here. Where Docker is missing and cannot be installed (no root), say so and run the rest.
markers=()
if [ "$(id -u)" != 0 ] && ! docker version >/dev/null 2>&1; then
  echo "[test] NOTE: no Docker engine and not root: the container tests (-m container) do" \
       "not run; the other tests use local Kafka processes" >&2
  markers=(-m "not container")
fi
dockerds() { pgrep -f 'dockerd --data-root=/var/lib/kafka-changelog-docker' | sort || true; }
dockerd_before=$(dockerds)
before=$(brokers)
spark_before=$(spark_processes)
# Two test workers (pytest-xdist; TEST_WORKERS=0 runs them in this process, one by one):
# every worker starts its own brokers and Spark, so the tests share nothing between them.
# Each worker takes whole modules (--dist loadscope), so a module's fixtures (a three-node
# cluster, a Connect server, a streaming run several tests read) are made once, not once per
# worker; the queue starts with the longest modules (tests/conftest.py, not xdist's order by
# test count), so no worker is left with a long module at the end.
.venv/bin/pytest -q -n "${TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder "${markers[@]}" "$@"
# Every broker the tests started must be gone (allow a few seconds for the last kill). A
# broker the tests left behind has lost its parent (pytest has exited); brokers of other
# programs running on the machine still have theirs and are not counted.
orphans() {
  for pid in $(comm -13 <(echo "$before") <(brokers)); do
    parent=$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ')
    # A parent running Python (``python`` or a ``pytest`` entry script) is a live test run,
    # possibly another one on this machine: not an orphan.
    if [ -n "$parent" ] && { [ "$parent" = 1 ] || ! ps -o args= -p "$parent" | grep -qE 'python|pytest'; }; then
      echo "$pid"
    fi
  done
}
# A Spark process the tests left behind lost its parent (a worker, an executor, a JVM running
# Python workers): it now belongs to init. Those of other programs still have their parents.
spark_orphans() {
  for pid in $(comm -13 <(echo "$spark_before") <(spark_processes)); do
    [ "$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ')" = 1 ] && echo "$pid"
  done
  true
}
for _ in 1 2 3 4 5 6 7 8 9 10; do
  leftover=$( (orphans; spark_orphans) | tr '\n' ' ')
  [ -z "${leftover// /}" ] && break
  sleep 1
done
if [ -n "${leftover// /}" ]; then
  echo "[test] FAIL: Kafka or Spark processes started by the tests are still running: $leftover" >&2
  exit 1
fi
# The dockerd the container tests started is stopped by the last of them (and with it every
# container it ran).
for _ in 1 2 3 4 5 6 7 8 9 10; do
  leftover_dockerd=$(comm -13 <(echo "$dockerd_before") <(dockerds) | tr '\n' ' ')
  [ -z "${leftover_dockerd// /}" ] && break
  sleep 1
done
if [ -n "${leftover_dockerd// /}" ]; then
  echo "[test] FAIL: the dockerd the tests started is still running: $leftover_dockerd" >&2
  exit 1
fi
echo "[test] no broker, Spark process or dockerd left running"
