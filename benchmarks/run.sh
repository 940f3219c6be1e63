#!/usr/bin/env bash
# Run all benchmarks from the repository root with the project's virtualenv.
#   ./benchmarks/run.sh                  # full run (~10 min on a quiet machine),
#                                        # writes benchmarks/results/latest.json
#   BENCH_SCALE=0.1 ./benchmarks/run.sh  # smoke run (~1 min)
# Environment: BENCH_SCALE, BENCH_QUIET_WAIT_S, BENCH_QUIET_SHARE, KAFKA_BOOTSTRAP_SERVERS
# (see benchmarks/README.md). Extra arguments go to benchmarks/run_all.py, e.g.
#   ./benchmarks/run.sh --only persist_latency --json /tmp/latency.json
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="$here/../.venv/bin/python"
if [[ ! -x "$python" ]]; then
    echo "no virtualenv at $here/../.venv (create it and install the project first)" >&2
    exit 2
fi
cd "$here/.."
exec "$python" -m benchmarks.run_all "$@"
