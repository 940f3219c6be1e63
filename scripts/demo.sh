#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the main job end to end. It starts a local
# Kafka broker itself unless KAFKA_BOOTSTRAP_SERVERS points at one.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m examples.streaming_demo "$@"
