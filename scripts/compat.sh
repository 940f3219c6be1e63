#!/usr/bin/env bash
# The compatibility run against each supported Apache Kafka broker release: the storage
# contract, the transactional commit of checkpoints with outputs, a stateful streaming query
# with KafkaOutputSink read back through Spark's own connector, and the CLI, each on local
# nodes of that release (jars from Maven Central, cached). KAFKA_VERSIONS picks releases
# (default: every tested release, kafka_changelog.local_kafka.jars.TESTED_RELEASES); extra
# arguments go to pytest. The test command
# (scripts/test.sh) runs a share of it: tests/kafka/test_broker_versions.py.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh test
tests=(tests/kafka/test_kafka_contract.py tests/kafka/test_kafka_storage.py
       tests/kafka/test_transactional_commit.py tests/kafka/test_task_commit.py
       tests/spark/test_kafka_connector.py tests/cli/test_cli_applications.py)
failed=()
tested=$(.venv/bin/python -c 'from kafka_changelog.local_kafka.jars import TESTED_RELEASES as t; print(*t)')
for version in ${KAFKA_VERSIONS:-$tested}; do
  echo "[compat] Apache Kafka $version"
  start=$(date +%s)
  .venv/bin/python -m kafka_changelog.local_kafka.jars "$version" >/dev/null
  if .venv/bin/pytest -q -n 0 -p no:cacheprovider --kafka-version "$version" "${tests[@]}" "$@"; then
    echo "[compat] Apache Kafka $version: passed in $(( $(date +%s) - start )) s"
  else
    echo "[compat] Apache Kafka $version: FAILED" >&2
    failed+=("$version")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "[compat] failed against: ${failed[*]}" >&2
  exit 1
fi
echo "[compat] every release passed"
