"""The seeded chaos soak, short: one seed on the standalone Spark cluster and three
brokers (see ``tests/soak``). It injects the faults that no other test of the suite
injects, an executor kill and a broker pause, around a restart of the driver (a
rescale), and runs both stateful functions (per-key and vectorised) and both state
backends' working copies across that restart. State and outputs must equal the model
at the restart and at the end (our reader, the CLI, Spark's connector with
``read_committed``); ``processor.reports`` stays within ``reports_kept``.

The other kinds of fault are tested without the soak, where their effect is checked
more closely (see :data:`ELSEWHERE`): driver kills and rescales, a Python worker killed
in and after its task's transaction, and a worker lost with its executor on the cluster
in ``tests/spark/test_streaming_exactly_once.py``; a broker killed mid-batch in
``tests/spark/test_three_brokers.py``; a fresh checkpointLocation continuing at the
state's input offsets in ``tests/spark/test_input_offsets.py``. The long soak
(``scripts/soak.sh``: 500 batches, 50 faults of every kind; docs/operations.md) runs
them all together.

A failing seed prints the command that reruns its schedule
(``python -m tests.soak.run --seed N ...``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from tests.soak import checks
from tests.soak.faults import FaultKind
from tests.soak.harness import BROKER_OVERRIDES, REPORTS_KEPT, Soak, SoakSettings
from tests.soak.run import report

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.three_nodes,
              pytest.mark.spark_cluster]

#: The seed (with its batches and faults): a broker pause, a rescale to parallelism 3
#: (vectorized/memory redeployed as per-key/rocksdb) and an executor kill of the new
#: driver's application. Five batches keep it short: each restart costs a driver's start.
SEEDS = [SoakSettings(268, batches=5, faults=3, measure_at=2)]

#: Faults no other test injects on the cluster: the seeds must inject every one.
ONLY_HERE = {FaultKind.EXECUTOR_KILL, FaultKind.BROKER_PAUSE}

#: The other kinds, each with the test that injects it (module, test function).
ELSEWHERE = {
    FaultKind.DRIVER_KILL: ("tests/spark/test_streaming_exactly_once.py",
                            "test_state_is_exactly_once_across_kills_and_rescaling"),
    FaultKind.RESCALE: ("tests/spark/test_streaming_exactly_once.py",
                        "test_state_is_exactly_once_across_kills_and_rescaling"),
    FaultKind.PYTHON_WORKER_KILL: ("tests/spark/test_streaming_exactly_once.py",
                                   "test_state_is_exactly_once_across_kills_and_rescaling"),
    FaultKind.BROKER_KILL: ("tests/spark/test_three_brokers.py",
                            "test_a_broker_killed_mid_batch_loses_and_repeats_nothing"),
    FaultKind.FRESH_CHECKPOINT: (
        "tests/spark/test_input_offsets.py",
        "test_a_second_deployment_is_refused_and_continues_from_the_states_offsets"),
}

REPO = Path(__file__).resolve().parents[2]


#: ``BROKER_OVERRIDES`` that a running cluster takes as dynamic cluster-wide defaults (the
#: retention check's interval is static: five minutes, longer than this short soak).
DYNAMIC_OVERRIDES = {key: value for key, value in BROKER_OVERRIDES.items()
                     if key != "log.retention.check.interval.ms"}


def _cluster_defaults(cluster: LocalKafkaCluster, operation: AlterConfigOpType) -> None:
    # Per broker (librdkafka names no cluster-wide resource); Kafka takes these there too.
    admin = AdminClient(cluster.client_config())
    brokers = admin.list_topics(timeout=60).brokers
    resources = [ConfigResource(ConfigResource.Type.BROKER, str(broker), incremental_configs=[
        ConfigEntry(key, value, incremental_operation=operation)
        for key, value in DYNAMIC_OVERRIDES.items()]) for broker in sorted(brokers)]
    assert len(resources) == cluster.node_count, brokers
    for resource in resources:  # one broker resource per request
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=60)


@pytest.fixture(scope="module")
def soak_kafka(kafka_cluster_3: LocalKafkaCluster) -> Iterator[LocalKafkaCluster]:
    """The suite's three nodes, whose segments roll small and soon (see
    ``BROKER_OVERRIDES``) while the soak runs: the 1-GiB segments of their static
    configuration would never free disk in a soak."""
    _cluster_defaults(kafka_cluster_3, AlterConfigOpType.SET)
    yield kafka_cluster_3
    _cluster_defaults(kafka_cluster_3, AlterConfigOpType.DELETE)


def test_the_seeds_cover_the_faults_no_other_test_injects_and_every_variant() -> None:
    # Every kind is either injected here or named with the test that injects it (a new
    # kind must be placed), and that test exists.
    assert ONLY_HERE | set(ELSEWHERE) == set(FaultKind)
    assert not ONLY_HERE & set(ELSEWHERE)
    for module, test in ELSEWHERE.values():
        assert f"def {test}(" in (REPO / module).read_text(), (module, test)
    kinds = set()
    variants = set()
    for settings in SEEDS:
        soak_plan = Soak.plan(settings)
        kinds |= {fault.kind for fault in soak_plan.schedule}
        assert any(fault.kind.restarts_driver for fault in soak_plan.schedule)
        variants |= {soak_plan.variant, *(fault.variant for fault in soak_plan.schedule)}
    assert kinds >= ONLY_HERE
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
    # An executor kill that found no executor would have tested nothing.
    assert all(f.detail.startswith("pid ") for f in result.injected
               if f.kind is FaultKind.EXECUTOR_KILL), result.injected
    assert result.batches >= settings.batches
    assert result.last is not None and 0 < result.last.reports <= REPORTS_KEPT
