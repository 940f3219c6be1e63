#!/usr/bin/env bash
# A virtualenv with the newest PySpark release for the Spark sides of bench_sessions
# (Spark's operators on the file source need no Kafka connector and none of this
# project's packages). Safe to run twice: an existing venv with the wanted release
# is kept. Usage: benchmarks/spark_newest_venv.sh [VERSION] (default 4.3.0).
set -euo pipefail
VERSION="${1:-${SPARK_NEWEST_VERSION:-4.3.0}}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${SPARK_NEWEST_VENV:-$ROOT/.venv-spark-newest}"
PYTHON="${PYTHON:-python3.11}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c \
    "import pyspark, sys; sys.exit(pyspark.__version__ != '$VERSION')" 2>/dev/null; then
  echo "$VENV has pyspark $VERSION"
  exit 0
fi
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# pandas/pyarrow/numpy: the Arrow-based operators; protobuf, grpcio: transformWithStateInPandas;
# psutil: the benchmark child imports nothing else.
"$VENV/bin/python" -m pip install --quiet "pyspark==$VERSION" pandas pyarrow numpy \
  "protobuf>=6.33.5,<7" grpcio psutil
"$VENV/bin/python" -c "import pyspark; print('$VENV: pyspark', pyspark.__version__)"
