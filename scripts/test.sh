#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs lint, type checks and the whole test suite
# against real Kafka brokers that the tests start and stop themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
echo "[test] ruff"
.venv/bin/ruff check .
echo "[test] mypy"
.venv/bin/mypy
echo "[test] pytest"
brokers() { pgrep -f 'kafka-changelog.*kafka\.Kafka' | sort || true; }
before=$(brokers)
.venv/bin/pytest -q "$@"
# Every broker the tests started must be gone (allow a few seconds for the last kill). A
# broker the tests left behind has lost its parent (pytest has exited); brokers of other
# programs running on the machine still have theirs and are not counted.
orphans() {
  for pid in $(comm -13 <(echo "$before") <(brokers)); do
    parent=$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ')
    if [ -n "$parent" ] && { [ "$parent" = 1 ] || ! ps -o comm= -p "$parent" | grep -q python; }; then
      echo "$pid"
    fi
  done
}
for _ in 1 2 3 4 5 6 7 8 9 10; do
  leftover=$(orphans | tr '\n' ' ')
  [ -z "${leftover// /}" ] && break
  sleep 1
done
if [ -n "${leftover// /}" ]; then
  echo "[test] FAIL: Kafka processes started by the tests are still running: $leftover" >&2
  exit 1
fi
echo "[test] no broker left running"
