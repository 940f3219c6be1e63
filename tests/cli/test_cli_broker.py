"""``kafka-changelog broker`` as a user runs it: in the foreground, stopped by a signal."""

from __future__ import annotations

import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_changelog.local_kafka.net import consecutive_free_ports, port_open

pytestmark = pytest.mark.broker

STARTUP_S = 180.0


class RunningBroker:
    """The command's process, its first line and its broker JVMs."""

    def __init__(self, proc: subprocess.Popen[str], banner: str) -> None:
        self.proc = proc
        self.banner = banner
        self.jvms = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)
                     if "java" in p.name()]

    def stop(self, signum: int) -> tuple[int, str]:
        """Send ``signum``; the exit code and stderr."""
        self.proc.send_signal(signum)
        _, err = self.proc.communicate(timeout=90)
        return self.proc.returncode, err


def _first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if selector.select(timeout=1.0):
                line = proc.stdout.readline()
                if line:
                    return line.rstrip("\n")
                proc.wait(timeout=30)  # end of its output: the command is exiting
            if proc.poll() is not None:
                raise AssertionError(f"the broker command exited with {proc.returncode} "
                                     "before its banner: "
                                     f"{proc.stderr.read() if proc.stderr else ''}")
    raise AssertionError(f"the broker command printed nothing within {STARTUP_S:.0f} s")


@contextmanager
def broker(*args: str) -> Iterator[RunningBroker]:
    proc = subprocess.Popen([sys.executable, "-m", "kafka_changelog.cli", "broker", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield RunningBroker(proc, _first_line(proc))
    finally:
        if proc.poll() is None:  # a failed test: its JVMs die with it (parent-death signal)
            proc.kill()
            proc.communicate(timeout=30)


def _gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(pid) for pid in pids)


def _records(servers: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "cli-broker-test",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        found: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(found) < count and time.monotonic() < deadline:
            found += [m.value() for m in consumer.consume(count, timeout=1)
                      if m.error() is None]
        return found
    finally:
        consumer.close()


def test_broker_serves_clients_and_keeps_its_data_dir_across_restarts(tmp_path: Path) -> None:
    port = consecutive_free_ports(1)
    data = tmp_path / "kafka"
    servers = f"localhost:{port}"
    with broker("--port", str(port), "--data-dir", str(data)) as first:
        assert first.banner == f"Kafka is up at {servers} (KRaft, 1 node); Ctrl-C stops it"
        assert len(first.jvms) == 1
        admin = AdminClient({"bootstrap.servers": servers})
        admin.create_topics([NewTopic("kept", 1, 1)])["kept"].result(30)
        producer = Producer({"bootstrap.servers": servers, "acks": "all"})
        for value in (b"one", b"two", b"three"):
            producer.produce("kept", value)
        assert producer.flush(30) == 0
        assert _records(servers, "kept", 3) == [b"one", b"two", b"three"]
        code, err = first.stop(signal.SIGINT)
    assert code == 0, err
    assert "SIGINT: stopping Kafka ..." in err and "Kafka stopped" in err
    assert _gone(first.jvms)
    assert not port_open("127.0.0.1", port)

    with broker("--port", str(port), "--data-dir", str(data)) as second:
        assert second.banner == first.banner
        assert _records(servers, "kept", 3) == [b"one", b"two", b"three"]
        code, err = second.stop(signal.SIGTERM)
    assert code == 0, err
    assert "SIGTERM: stopping Kafka ..." in err
    assert _gone(second.jvms)
    assert (data / "node-1" / "data" / "meta.properties").exists()


def test_three_nodes_on_consecutive_ports(tmp_path: Path) -> None:
    port = consecutive_free_ports(3)
    servers = ",".join(f"localhost:{port + i}" for i in range(3))
    with broker("--port", str(port), "--nodes", "3") as running:
        assert running.banner == f"Kafka is up at {servers} (KRaft, 3 nodes); Ctrl-C stops it"
        assert len(running.jvms) == 3
        admin = AdminClient({"bootstrap.servers": servers})
        assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]
        admin.create_topics([NewTopic("replicated", 1, 3)])["replicated"].result(30)
        producer = Producer({"bootstrap.servers": servers, "acks": "all"})
        producer.produce("replicated", b"x")
        assert producer.flush(30) == 0
        code, err = running.stop(signal.SIGINT)
    assert code == 0, err
    assert _gone(running.jvms)


def test_a_port_in_use_is_refused_by_name() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "kafka_changelog.cli", "broker", "--port", str(port)],
            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert (f"the broker did not start: port {port} on 127.0.0.1 is in use (another "
            "Kafka?); pick another client port") in result.stderr
    assert result.stdout == ""
