"""The Kafka test harness against real brokers: data paths, fail-over, security, kcat, cleanup."""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from kafka_changelog.local_kafka import process
from kafka_changelog.local_kafka.broker import BrokerStartError, LocalKafkaCluster
from kafka_changelog.local_kafka.workdir import sweep_stale_roots
from kafka_changelog.testing.cluster import KafkaCluster
from kafka_changelog.testing.external import BOOTSTRAP_ENV
from kafka_changelog.testing.pytest_plugin import SECURE_USERS, TopicFactory

pytestmark = pytest.mark.broker

REPO_ROOT = Path(__file__).resolve().parents[2]


# -- helpers ---------------------------------------------------------------------------


def consume_all(
    config: dict[str, Any], topic: str, partition: int = 0, timeout: float = 30.0
) -> list[Message]:
    """Every record of ``topic``/``partition`` up to its current high watermark."""
    consumer = Consumer(
        {
            **config,
            "group.id": f"harness-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        records: list[Message] = []
        last = -1
        deadline = time.monotonic() + timeout
        while last < high - 1 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            records.append(msg)
            last = msg.offset() or 0
        assert last == high - 1, f"read {len(records)} records of {topic}/{partition}, end {high}"
        return records
    finally:
        consumer.close()


def produce_and_wait(
    config: dict[str, Any], topic: str, value: bytes, timeout: float = 15.0
) -> KafkaError | None:
    """Produce one record and return its delivery error (None = acknowledged)."""
    outcome: list[KafkaError | None] = []
    producer = Producer({**config, "acks": "all", "message.timeout.ms": int(timeout * 1000)})
    producer.produce(topic, value, on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(timeout + 5)
    assert outcome, f"no delivery report for {topic} within {timeout} s"
    return outcome[0]


@pytest.fixture(scope="module")
def local_cluster(request: pytest.FixtureRequest) -> Iterator[LocalKafkaCluster]:
    """The session cluster when it is a local one (the default), else a local node of our own."""
    if request.config.getoption("--broker") == "local" and not os.environ.get(BOOTSTRAP_ENV):
        shared = request.getfixturevalue("kafka_cluster")
        assert isinstance(shared, LocalKafkaCluster)
        yield shared
        return
    with LocalKafkaCluster(nodes=1) as own:
        yield own


@pytest.fixture(scope="module")
def failover_topic(kafka_cluster_3: LocalKafkaCluster) -> str:
    """A replication-factor-3 topic shared by the fail-over and rejoin tests."""
    from kafka_changelog.local_kafka.topics import create_topic, unique_topic_name

    name = unique_topic_name("failover")
    create_topic(
        kafka_cluster_3.admin_client(),
        name,
        partitions=1,
        replication_factor=3,
        config={"min.insync.replicas": "2"},
    )
    return name


# -- 1. single node round trip --------------------------------------------------------


def test_single_node_round_trip_keeps_keys_values_and_order(
    kafka_cluster: KafkaCluster, kafka_topic: str
) -> None:
    sent = [(f"key-{i % 7}".encode(), f"value-{i}".encode() * (1 + i % 5)) for i in range(500)]
    errors: list[KafkaError] = []
    producer = Producer({**kafka_cluster.client_config(), "acks": "all", "linger.ms": 5})
    for key, value in sent:
        producer.produce(
            kafka_topic, value, key, on_delivery=lambda e, _m: errors.append(e) if e else None
        )
    assert producer.flush(30) == 0
    assert errors == []

    received = consume_all(kafka_cluster.client_config(), kafka_topic)
    assert [(m.key(), m.value()) for m in received] == sent
    assert [m.offset() for m in received] == list(range(len(sent)))


# -- 2./3. three nodes: leader killed, then restarted ----------------------------------


def test_acknowledged_writes_survive_killing_the_leader(
    kafka_cluster_3: LocalKafkaCluster, failover_topic: str
) -> None:
    cluster, topic = kafka_cluster_3, failover_topic
    acked: list[int] = []
    failed: list[tuple[int, KafkaError]] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        seq = int(msg.value() or b"-1")
        if err is None:
            acked.append(seq)
        else:
            failed.append((seq, err))

    producer = Producer(
        {
            **cluster.client_config(),
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": 60000,
        }
    )
    seq = 0

    def produce_until(done: Callable[[], bool], limit: float) -> None:
        nonlocal seq
        deadline = time.monotonic() + limit
        while not done() and time.monotonic() < deadline:
            key = f"k{seq % 10}".encode()
            producer.produce(topic, str(seq).encode(), key, on_delivery=on_delivery)
            seq += 1
            producer.poll(0.002)
        assert done(), f"stalled: {len(acked)} acked, {len(failed)} failed, {seq} sent"

    produce_until(lambda: len(acked) >= 300, 30)
    victim = cluster.leader_of(topic, 0)
    seq_at_kill = seq
    cluster.kill_node(victim)
    # The producer must carry on through the election and be acknowledged for new records.
    produce_until(lambda: sum(1 for s in acked if s > seq_at_kill) >= 300, 60)
    assert producer.flush(60) == 0
    assert failed == []
    assert cluster.leader_of(topic, 0) != victim

    values = [int(m.value() or b"-1") for m in consume_all(cluster.client_config(), topic)]
    assert len(values) == len(set(values)), "a record was written twice"
    assert values == sorted(values), "records are out of order within the partition"
    lost = sorted(set(acked) - set(values))
    assert not lost, f"{len(lost)} acknowledged records are missing, e.g. {lost[:10]}"
    assert acked == sorted(acked)


def test_killed_node_restarts_and_rejoins_the_isr(
    kafka_cluster_3: LocalKafkaCluster, failover_topic: str
) -> None:
    cluster, topic = kafka_cluster_3, failover_topic
    down = [i for i in range(cluster.node_count) if not cluster.is_running(i)]
    if down:
        victim = down[0]  # killed by the fail-over test above
    else:  # running on its own: make a victim
        victim = cluster.leader_of(topic, 0)
        cluster.kill_node(victim)
    # Writes while it is down give it something to catch up on.
    for i in range(20):
        assert produce_and_wait(cluster.client_config(), topic, f"while-down-{i}".encode()) is None

    started = time.monotonic()
    cluster.restart_node(victim, timeout=90)
    node_id = cluster.node_id(victim)
    admin = cluster.admin_client()
    meta = admin.list_topics(topic, timeout=10)
    assert node_id in meta.brokers
    for partition in meta.topics[topic].partitions.values():
        assert node_id in partition.replicas
        assert node_id in partition.isrs, f"{topic}/{partition.id} ISR {partition.isrs}"
    assert time.monotonic() - started < 90


# -- 4. pause / resume ----------------------------------------------------------------


def test_paused_node_holds_a_produce_until_resumed(
    local_cluster: LocalKafkaCluster, make_topic: TopicFactory
) -> None:
    topic = make_topic(cluster=local_cluster)
    outcome: list[KafkaError | None] = []
    producer = Producer(
        {**local_cluster.client_config(), "acks": "all", "message.timeout.ms": 60000}
    )
    producer.produce(topic, b"before", on_delivery=lambda e, _m: outcome.append(e))
    assert producer.flush(15) == 0 and outcome == [None]

    local_cluster.pause_node(0)
    try:
        producer.produce(topic, b"while-paused", on_delivery=lambda e, _m: outcome.append(e))
        deadline = time.monotonic() + 2.0  # below broker.session.timeout.ms: no fencing
        while time.monotonic() < deadline:
            producer.poll(0.1)
        assert len(outcome) == 1, "a produce completed although the only broker was paused"
    finally:
        local_cluster.resume_node(0)
    assert producer.flush(30) == 0
    assert outcome == [None, None]
    assert [m.value() for m in consume_all(local_cluster.client_config(), topic)] == [
        b"before",
        b"while-paused",
    ]


# -- 5./6. SASL and ACLs --------------------------------------------------------------


def test_wrong_password_fails_fast_and_admin_works(
    secure_kafka_cluster: LocalKafkaCluster,
) -> None:
    errors: list[KafkaError] = []
    started = time.monotonic()
    bad_config: dict[str, Any] = {
        **secure_kafka_cluster.client_config("alice", "not-her-password"),
        "error_cb": errors.append,
        "logger": logging.getLogger("test.harness.rdkafka"),  # keep stderr clean
    }
    bad = AdminClient(bad_config)
    while not errors and time.monotonic() - started < 15:
        bad.poll(0.1)  # serves error_cb
    elapsed = time.monotonic() - started
    assert errors, "no error reported for a wrong password"
    first = errors[0]
    assert first.code() == KafkaError._AUTHENTICATION or (
        "authentication failed" in first.str().lower()
    ), first
    assert elapsed < 10, f"the authentication error took {elapsed:.1f} s"
    with pytest.raises(KafkaException):
        bad.list_topics(timeout=2)

    good = secure_kafka_cluster.admin_client()
    assert good.list_topics(timeout=10).brokers
    alice = secure_kafka_cluster.client_config("alice")
    assert alice["sasl.password"] == SECURE_USERS["alice"]
    assert AdminClient(alice).list_topics(timeout=10).brokers  # right password: accepted


def test_write_needs_a_write_acl(
    secure_kafka_cluster: LocalKafkaCluster, make_topic: TopicFactory
) -> None:
    cluster = secure_kafka_cluster
    topic = make_topic(cluster=cluster)
    cluster.grant("alice", "TOPIC", topic, ["READ", "DESCRIBE"])
    alice = cluster.client_config("alice")

    # ACLs reach the broker's authorizer a moment after the controller commits them.
    deadline = time.monotonic() + 15
    error = produce_and_wait(alice, topic, b"denied")
    while (error is None or error.code() != KafkaError.TOPIC_AUTHORIZATION_FAILED) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.3)
        error = produce_and_wait(alice, topic, b"denied")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error

    cluster.grant("User:alice", "TOPIC", topic, "WRITE")
    deadline = time.monotonic() + 15
    error = produce_and_wait(alice, topic, b"allowed")
    while error is not None and time.monotonic() < deadline:
        time.sleep(0.3)
        error = produce_and_wait(alice, topic, b"allowed")
    assert error is None, error
    assert [m.value() for m in consume_all(cluster.client_config(), topic)] == [b"allowed"]


# -- 7. kcat reads what confluent-kafka wrote -----------------------------------------


def _kcat_options(config: dict[str, Any]) -> list[str]:
    options = ["-b", str(config["bootstrap.servers"])]
    for key, value in config.items():
        if key != "bootstrap.servers":
            options += ["-X", f"{key}={value}"]
    return options


def _parse_kcat(output: bytes, count: int) -> list[tuple[int, bytes | None, bytes | None, str]]:
    """Parse records printed with ``-f '%o %K %S %h\\n%k%s'`` (lengths make it binary safe)."""
    records: list[tuple[int, bytes | None, bytes | None, str]] = []
    pos = 0
    for _ in range(count):
        line_end = output.index(b"\n", pos)
        offset, key_len, value_len, headers = output[pos:line_end].decode().split(" ", 3)
        pos = line_end + 1
        fields: list[bytes | None] = []
        for length in (int(key_len), int(value_len)):
            if length < 0:
                fields.append(None)
            else:
                fields.append(output[pos : pos + length])
                pos += length
        records.append((int(offset), fields[0], fields[1], headers))
    assert pos == len(output), f"{len(output) - pos} unparsed bytes after {count} records"
    return records


def test_kcat_reads_back_exact_bytes(kafka_cluster: KafkaCluster, kafka_topic: str) -> None:
    sent: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = [
        (b"plain", b"hello", [("h1", b"v1")]),
        (b"\x00\xff\xfe binary key", bytes(range(256)), [("kind", b"binary"), ("n", b"2")]),
        (None, b"no key\nwith newline \x80\x81", []),
        (b"tombstone", None, [("deleted", b"yes")]),
        (b"", b"", [("empty", b"")]),
        ("ключ".encode(), "znač\u00e9nie \U0001f600".encode(), [("utf8", "ü".encode())]),
    ]
    producer = Producer({**kafka_cluster.client_config(), "acks": "all"})
    for key, value, headers in sent:
        header_list: list[tuple[str, str | bytes | None]] = list(headers)
        producer.produce(kafka_topic, value, key, headers=header_list)
    assert producer.flush(30) == 0

    argv = [
        "kcat",
        "-C",
        *_kcat_options(kafka_cluster.client_config()),
        "-t",
        kafka_topic,
        "-p",
        "0",
        "-o",
        "beginning",
        "-c",
        str(len(sent)),
        "-e",
        "-q",
        "-f",
        "%o %K %S %h\n%k%s",
    ]
    done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    records = _parse_kcat(done.stdout, len(sent))
    assert [r[0] for r in records] == list(range(len(sent)))
    assert [(r[1], r[2]) for r in records] == [(k, v) for k, v, _ in sent]
    expected_headers = [",".join(f"{n}={v.decode()}" for n, v in h) for _, _, h in sent]
    assert [r[3] for r in records] == expected_headers


# -- 8. nothing leaks ------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_stop_leaves_no_process_and_no_directory() -> None:
    cluster = LocalKafkaCluster(nodes=1)
    cluster.start()
    pids = cluster.pids()
    assert pids and all(_alive(p) for p in pids)
    family = pids + [c.pid for p in pids for c in psutil.Process(p).children(recursive=True)]
    root = cluster.root_dir
    cluster.stop()
    cluster.stop()  # idempotent
    assert _wait_gone(family, 5) == []
    assert not root.exists()
    assert not set(family) & set(process.tracked_pids())


def test_failed_start_reports_exit_code_and_log_and_cleans_up() -> None:
    cluster = LocalKafkaCluster(nodes=1, broker_overrides={"num.network.threads": "0"})
    with pytest.raises(BrokerStartError) as caught:
        cluster.start()
    assert caught.value.exit_code not in (None, 0)
    assert "num.network.threads" in caught.value.log_tail
    assert cluster.pids() == []
    with pytest.raises(Exception, match="not started"):
        _ = cluster.bootstrap_servers


def test_brokers_die_with_a_sigkilled_python_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, sys, time
        from kafka_changelog.local_kafka.broker import LocalKafkaCluster
        cluster = LocalKafkaCluster(nodes=1).start()
        print(json.dumps({"pids": cluster.pids(), "root": str(cluster.root_dir)}), flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=REPO_ROOT, text=True
    )
    try:
        assert child.stdout is not None
        # A child that never prints (its broker never starts) fails the test in 3 minutes.
        ready, _, _ = select.select([child.stdout], [], [], 180)
        assert ready, "the child started no cluster within 180 s"
        line = child.stdout.readline()
        assert line, f"the child failed to start a cluster (exit code {child.poll()})"
        info = json.loads(line)
        assert all(_alive(p) for p in info["pids"])
    finally:
        child.kill()
        child.wait(10)
    assert _wait_gone(info["pids"], 10) == [], "a broker outlived its SIGKILLed parent"
    # Its directory could not be removed by the dead parent; the next cluster start sweeps it.
    assert Path(info["root"]).exists()
    sweep_stale_roots()
    assert not Path(info["root"]).exists()
