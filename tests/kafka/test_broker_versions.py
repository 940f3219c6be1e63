"""CI's share of the compatibility run: the storage contract and the transactional commit
of checkpoints with outputs, unchanged, against the other supported Apache Kafka releases
(the oldest, 3.9.1, and the newest, 4.4.0; the rest of the suite runs the library's
default, 4.1.1). ``scripts/compat.sh`` runs more of the suite per release (the Spark
connector around a stateful query, the CLI)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from kafka_changelog.local_kafka.jars import KAFKA_VERSION, TESTED_RELEASES

from . import test_kafka_contract as contract
from .test_transactional_commit import (
    test_a_failing_step_aborts_its_outputs,
    test_an_older_committer_is_fenced,
    test_outputs_become_visible_with_their_checkpoint,
)

pytestmark = pytest.mark.broker

#: The tested releases besides the default, which the rest of the suite runs.
OTHER_RELEASES = tuple(v for v in TESTED_RELEASES if v != KAFKA_VERSION)


@pytest.fixture(scope="module", params=OTHER_RELEASES)
def kafka_cluster(request: pytest.FixtureRequest) -> Iterator[LocalKafkaCluster]:
    """A single node of each release in turn (this module's ``kafka_cluster``)."""
    with LocalKafkaCluster(nodes=1, kafka_version=request.param) as cluster:
        yield cluster


def test_the_node_runs_the_release_it_was_asked_for(kafka_cluster: LocalKafkaCluster) -> None:
    log = kafka_cluster.log_path(0).read_text(errors="replace")
    assert f"Kafka version: {kafka_cluster.kafka_version}" in log, log[-2000:]


class TestStorageContractOnOtherReleases(contract.TestKafkaStorageContract):
    """The Kafka storage contract on this module's nodes."""


__all__ = ["TestStorageContractOnOtherReleases",
           "test_a_failing_step_aborts_its_outputs", "test_an_older_committer_is_fenced",
           "test_outputs_become_visible_with_their_checkpoint"]


def test_the_readme_support_table_names_every_tested_release() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| Apache Kafka brokers"))
    assert row.split("|")[2].strip() == ", ".join(TESTED_RELEASES), row
