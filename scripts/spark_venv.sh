#!/usr/bin/env bash
# scripts/spark_venv.sh VERSION: a virtualenv with this project and PySpark VERSION (one of
# the supported releases, spark_integration.sessions.spark_versions.TESTED_RELEASES), made
# once per machine and kept in ~/.cache/kafka-changelog/spark-venvs (or
# KAFKA_CHANGELOG_SPARK_VENVS), with Spark's Kafka connector of that version resolved; prints
# its Python. The installed release (.venv) needs none: its Python is printed. Safe to run
# twice: a venv whose PySpark and project requirements are current is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/spark_venv.sh VERSION}
installed=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pyspark"))')
if [ "$version" = "$installed" ]; then
  echo "$PWD/.venv/bin/python"
  exit 0
fi
root=${KAFKA_CHANGELOG_SPARK_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/kafka-changelog/spark-venvs}
venv="$root/pyspark-$version"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
stamp="$venv/.kafka-changelog-installed"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[spark-venv] PySpark $version in $venv" >&2
  mkdir -p "$root"
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -e ".[spark,connect,test,metrics]" \
    "pyspark[connect]==$version" >&2
  echo "$want" > "$stamp"
fi
# The project is installed editable: a venv made from another clone is pointed at this one
# (also when that clone is gone: the import then finds no module file, or none at all).
# Asked from outside the clone: here its own directory would be found first, whatever the
# venv points at (and pytest imports the library through its plugin before any test).
source_root=$(cd / && "$venv/bin/python" -c '
import pathlib
try:
    import kafka_changelog
    print(pathlib.Path(kafka_changelog.__file__).parents[1])
except Exception:
    print("")' 2>/dev/null || true)
if [ "$source_root" != "$PWD" ]; then
  "$venv/bin/python" -m pip install -q --no-deps -e . >&2
fi
"$venv/bin/python" -m spark_integration.sessions.connector >/dev/null
echo "$venv/bin/python"
