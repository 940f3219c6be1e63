#!/usr/bin/env bash
# The long chaos soak: the clickstream job on a local Spark standalone cluster and three
# local brokers (loopback only) under a seeded schedule of faults; see docs/operations.md.
#
#   scripts/soak.sh                                   500 batches, 50 faults, seed 1
#   scripts/soak.sh --batches 500 --faults 50 --seed 7 --output /tmp/soak.json
#
# Options are those of `python -m tests.soak.run --help`; the result is written as JSON
# to benchmarks/results/soak_long.json unless --output says otherwise. Exit code 0 when
# every seed passed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
args=("$@")
[[ " ${args[*]-} " == *" --output "* ]] || args+=(--output benchmarks/results/soak_long.json)
[[ " ${args[*]-} " == *" --batches "* ]] || args+=(--batches 500)
[[ " ${args[*]-} " == *" --faults "* ]] || args+=(--faults 50)
exec "$PYTHON" -m tests.soak.run "${args[@]}"
