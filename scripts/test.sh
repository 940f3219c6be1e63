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
.venv/bin/pytest -q "$@"
leftover=$(pgrep -f 'kafka-changelog.*kafka\.Kafka' || true)
if [ -n "$leftover" ]; then
  echo "[test] FAIL: Kafka processes left running: $leftover" >&2
  exit 1
fi
