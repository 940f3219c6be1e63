#!/usr/bin/env bash
# Installs what the main job needs (scripts/setup.sh demo: no Docker, no test tools), then
# runs it end to end. It starts a local Kafka broker itself unless KAFKA_BOOTSTRAP_SERVERS
# points at one.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh demo
exec .venv/bin/python -m examples.streaming_demo "$@"
