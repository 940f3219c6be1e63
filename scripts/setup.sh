#!/usr/bin/env bash
# scripts/setup.sh [demo|test]: installs what the main job (demo) or the test suite (test,
# the default) needs on a fresh Debian machine; safe to run again.
#   - Debian packages: kcat (real Kafka tooling), a JDK and Maven if missing; for the tests,
#     as root, also docker.io, debootstrap and docker-compose (the container tests)
#   - a virtualenv in .venv with the project and the role's extras (demo: spark; test:
#     spark, connect, test, dev)
#   - the Apache Kafka broker jars and Spark's Kafka connector (format("kafka")) from Maven
#     Central, in ~/.cache/kafka-changelog
#   - for the tests, a virtualenv per older supported PySpark release with its connector
#     (scripts/spark_venv.sh, in ~/.cache/kafka-changelog/spark-venvs)
set -euo pipefail
cd "$(dirname "$0")/.."

role=${1:-test}
case "$role" in
  demo) extras=spark ;;
  test) extras=spark,connect,test,dev ;;
  *) echo "usage: scripts/setup.sh [demo|test] (got '$role')" >&2; exit 2 ;;
esac

log() { printf '[setup] %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root to run: $*"; return 1; fi
}

missing=()
command -v kcat >/dev/null || missing+=(kcat)
command -v java >/dev/null || missing+=(default-jdk-headless)
command -v mvn >/dev/null || missing+=(maven)
# The container tests (tests/container, pytest -m container): Debian's Docker engine,
# debootstrap (the images are built here from Debian packages) and its compose client.
# Only as root (or with sudo); without them scripts/test.sh runs the other tests and says so.
if [ "$role" = test ] && { [ "$(id -u)" = 0 ] || command -v sudo >/dev/null; }; then
  command -v dockerd >/dev/null || missing+=(docker.io)
  [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
# spark_integration.sessions.spark_versions.TESTED_RELEASES[-1]
SPARK_RELEASE=4.2.0
if [ ! -x .venv/bin/python ]; then
  log "creating virtualenv .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
# One stamp per role: the test role's extras include the demo's, so its install stamps both.
stamp=.venv/.kafka-changelog-installed-$role
want="$(sha256sum pyproject.toml | cut -d' ' -f1) pyspark-$SPARK_RELEASE"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing the project and its extras ($extras) into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  # The newest tested PySpark: the extras take any supported one (pyspark>=4.0.0,<4.3), and
  # pip would pick the newest on PyPI, whose Kafka connector Maven Central may not serve
  # (4.2.1's is not). tests/project/test_setup.py keeps this pin on the newest tested release.
  .venv/bin/python -m pip install -q -e ".[$extras]" "pyspark==$SPARK_RELEASE"
  echo "$want" > "$stamp"
  [ "$role" = test ] && echo "$want" > .venv/.kafka-changelog-installed-demo
fi

log "resolving the Kafka broker jars (Maven Central, cached)"
if [ "$role" = test ]; then
  # Every tested release: the suite and scripts/compat.sh run them all.
  .venv/bin/python -m kafka_changelog.local_kafka.jars --tested
else
  .venv/bin/python -m kafka_changelog.local_kafka.jars
fi
log "resolving Spark's Kafka connector jars (Maven Central, cached)"
.venv/bin/python -m spark_integration.sessions.connector >/dev/null
if [ "$role" = test ]; then
  # The older supported PySpark releases, each in a virtualenv of its own (made once per
  # machine): the suite runs a share of the compatibility run on them.
  installed=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pyspark"))')
  for version in $(.venv/bin/python -c \
      'from spark_integration.sessions.spark_versions import TESTED_RELEASES as t; print(*t)'); do
    if [ "$version" != "$installed" ]; then
      log "PySpark $version in its own virtualenv (cached)"
      ./scripts/spark_venv.sh "$version" >/dev/null
    fi
  done
fi
# Bytecode of the project's own modules (an editable install: pip compiled only the
# dependencies). Every Spark driver, Python worker daemon, job and CLI process imports
# them; where PYTHONDONTWRITEBYTECODE is set no process writes a cache, and each would
# compile some 160 modules again (~0.3 CPU-s per process). Stale files are never read:
# Python checks each against its source.
.venv/bin/python -m compileall -q -j 0 kafka_changelog spark_integration examples tests \
  benchmarks >/dev/null
log "ready"
