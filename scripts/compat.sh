#!/usr/bin/env bash
# scripts/compat.sh [kafka|spark|all] [pytest args...]: the compatibility run (default: all).
#   kafka: per supported Apache Kafka broker release (KAFKA_VERSIONS, default every tested
#     release, kafka_changelog.local_kafka.jars.TESTED_RELEASES) the storage contract, the
#     transactional commit of checkpoints with outputs, a stateful streaming query with
#     KafkaOutputSink read back through Spark's own connector, and the CLI, on local nodes of
#     that release (jars from Maven Central, cached).
#   spark: per supported PySpark release (SPARK_VERSIONS, default every tested release,
#     spark_integration.sessions.spark_versions.TESTED_RELEASES), in a virtualenv of its own
#     (scripts/spark_venv.sh, cached): the version checks, the Spark reader (modes changes,
#     state, timers), the change feed, the state writer (repair, replace, bootstrap, a kill
#     mid-write) and the streaming exactly-once run with driver, task and Python worker
#     kills (local[n]).
# The test command (scripts/test.sh) runs a share of each: tests/kafka/test_broker_versions.py
# and tests/spark/test_older_spark.py.
set -euo pipefail
cd "$(dirname "$0")/.."
part=all
case "${1:-}" in kafka|spark|all) part=$1; shift ;; esac
./scripts/setup.sh test
failed=()

kafka_tests=(tests/kafka/test_kafka_contract.py tests/kafka/test_kafka_storage.py
             tests/kafka/test_transactional_commit.py tests/kafka/test_task_commit.py
             tests/spark/test_kafka_connector.py tests/cli/test_cli_applications.py)
if [ "$part" != spark ]; then
  tested=$(.venv/bin/python -c 'from kafka_changelog.local_kafka.jars import TESTED_RELEASES as t; print(*t)')
  for version in ${KAFKA_VERSIONS:-$tested}; do
    echo "[compat] Apache Kafka $version"
    start=$(date +%s)
    .venv/bin/python -m kafka_changelog.local_kafka.jars "$version" >/dev/null
    if .venv/bin/pytest -q -n 0 -p no:cacheprovider --kafka-version "$version" \
        "${kafka_tests[@]}" "$@"; then
      echo "[compat] Apache Kafka $version: passed in $(( $(date +%s) - start )) s"
    else
      echo "[compat] Apache Kafka $version: FAILED" >&2
      failed+=("kafka-$version")
    fi
  done
fi

spark_tests=(tests/spark/test_spark_versions.py tests/spark/test_reader.py
             tests/spark/test_change_feed.py tests/spark/test_timers_reader.py
             tests/spark/test_state_writer.py tests/spark/test_state_bootstrap.py
             "tests/spark/test_streaming_exactly_once.py::test_state_is_exactly_once_across_kills_and_rescaling[local]")
if [ "$part" != kafka ]; then
  tested=$(.venv/bin/python -c 'from spark_integration.sessions.spark_versions import TESTED_RELEASES as t; print(*t)')
  for version in ${SPARK_VERSIONS:-$tested}; do
    echo "[compat] PySpark $version"
    start=$(date +%s)
    python=$(./scripts/spark_venv.sh "$version")
    if "$(dirname "$python")/pytest" -q -n 0 -p no:cacheprovider "${spark_tests[@]}" "$@"; then
      echo "[compat] PySpark $version: passed in $(( $(date +%s) - start )) s"
    else
      echo "[compat] PySpark $version: FAILED" >&2
      failed+=("pyspark-$version")
    fi
  done
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "[compat] failed: ${failed[*]}" >&2
  exit 1
fi
echo "[compat] every release passed"
