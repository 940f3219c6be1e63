"""The seeded chaos soak, short: a fixed set of seeds on the standalone Spark cluster and
three brokers (see ``tests/soak``). Between them the seeds inject every kind of fault
(driver, Python worker, executor and broker kills, a broker pause, a rescale and a fresh
checkpointLocation) and run both stateful functions (per-key and vectorised) and both
state backends' working copies in the two combinations below. State and outputs must
equal the model at every restart and at the end (our reader, the CLI, Spark's connector
with ``read_committed``); ``processor.reports`` stays within ``reports_kept``.

A failing seed prints the command that reruns its schedule
(``python -m tests.soak.run --seed N ...``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from tests.soak import checks
from tests.soak.faults import FaultKind
from tests.soak.harness import BROKER_OVERRIDES, REPORTS_KEPT, Soak, SoakSettings
from tests.soak.run import report

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.three_nodes,
              pytest.mark.spark_cluster]

#: The seeds (with their batches and faults): together they inject every kind of fault and
#: run both functions and both backends (a restart may redeploy another variant).
SEEDS = [SoakSettings(1, batches=10, faults=7, measure_at=3)]


@pytest.fixture(scope="module")
def soak_kafka() -> Iterator[LocalKafkaCluster]:
    """Three local nodes whose segments roll small and soon (see ``BROKER_OVERRIDES``)."""
    # Not ``kafka_cluster_3``: its segments of 1 GiB would never free disk in a soak.
    with LocalKafkaCluster(nodes=3, broker_overrides=BROKER_OVERRIDES) as cluster:
        yield cluster


def test_the_seeds_cover_every_fault_and_variant() -> None:
    kinds = set()
    variants = set()
    for settings in SEEDS:
        soak_plan = Soak.plan(settings)
        kinds |= {fault.kind for fault in soak_plan.schedule}
        variants |= {soak_plan.variant, *(fault.variant for fault in soak_plan.schedule)}
    assert kinds == set(FaultKind)
    assert {v.split("/")[0] for v in variants} == {"per-key", "vectorized"}
    assert {v.split("/")[1] for v in variants} == {"memory", "rocksdb"}


@pytest.mark.parametrize("settings", SEEDS, ids=lambda s: f"seed{s.seed}")
def test_state_and_outputs_equal_the_model_under_seeded_faults(
    settings: SoakSettings, soak_kafka: LocalKafkaCluster, spark_cluster: Any, spark: Any,
    tmp_path: Path
) -> None:
    soak = Soak(settings, soak_kafka, spark_cluster, tmp_path)
    result = soak.run()
    result.problems += checks.spark_problems(spark, soak.config, soak.job.output_topic)
    assert result.passed, report(result)
    assert [f.kind for f in result.injected] == [f.kind for f in result.schedule]
    assert result.batches >= settings.batches
    assert result.last is not None and 0 < result.last.reports <= REPORTS_KEPT
