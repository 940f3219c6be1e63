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
# Every broker the tests started must be gone (allow a few seconds for the last kill).
for _ in 1 2 3 4 5 6 7 8 9 10; do
  leftover=$(comm -13 <(echo "$before") <(brokers) | tr '\n' ' ')
  [ -z "${leftover// /}" ] && break
  sleep 1
done
if [ -n "${leftover// /}" ]; then
  echo "[test] FAIL: Kafka processes started by the tests are still running: $leftover" >&2
  exit 1
fi
echo "[test] no broker left running"
