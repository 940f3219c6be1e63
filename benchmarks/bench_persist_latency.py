"""Persist latency at a sustained rate, against a raw producer's flush latency.

100-byte changes are appended at ~50,000 changes/s (rate-limited by sleeping to a
schedule), round robin over 128 key groups, with preemptive persistence on
(threshold 256 KiB, so background persists run between checkpoints). Every
100 ms a checkpoint calls ``persist`` and waits for its future; the latency is
from the call to the result. The baseline is a raw confluent-kafka ``Producer``
with the storage's settings and a 5 ms linger (``Broker.raw_producer_settings``),
producing one record per change at the same rate and calling ``flush()`` every
100 ms; its latency is the duration of ``flush()`` (which sends at once, linger or
not).

Each side writes a topic of its own, created for the run; the checkpoints of a run's first
``WARMUP_S`` are its warm-up, reported apart (their maximum) and left out of the
percentiles on both sides: the broker's first appends to a fresh topic's partitions
(its files' first writes) stall one early flush or persist by up to ~100 ms whatever the
client (measured: the writer's process idle meanwhile), and which checkpoint they hit
depends on when each side's first records go out.

Run: ``python -m benchmarks.bench_persist_latency [--json FILE]`` (``BENCH_SCALE``
scales the duration).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer

from benchmarks.common import (
    MAX_PARALLELISM,
    PARTITIONS,
    Broker,
    ForeignLoad,
    kafka_broker,
    latency_summary,
    machine_info,
    payloads,
    ratio_text,
    scaled,
    table,
    unique_topic,
    verdict,
    wait_for_quiet,
    write_json,
)
from kafka_changelog import KeyGroupRange
from kafka_changelog.kafka import KafkaChangelogStorage

RATE = 50_000  # changes/s
PAYLOAD_BYTES = 100
CHECKPOINT_INTERVAL_S = 0.1
DURATION_S = 20.0
THRESHOLD_BYTES = 256 * 1024
TICK_S = 0.001  # longest sleep between scheduling decisions
TARGET_P999_RATIO = 2.0
#: Seconds at the start of a run whose checkpoints are its warm-up (see the docstring).
WARMUP_S = 1.0

#: Appends ``count`` changes starting at change number ``first``.
AppendBatch = Callable[[int, int], None]
#: Runs one checkpoint and returns its latency in seconds.
Checkpoint = Callable[[], float]


@dataclass
class PacedRun:
    """What a rate-limited run achieved."""

    impl: str
    target_rate: float
    duration_s: float
    changes: int = 0
    elapsed_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    #: Latencies of the checkpoints of the first ``WARMUP_S`` (not in ``latencies_s``).
    warmup_latencies_s: list[float] = field(default_factory=list)
    skipped_checkpoints: int = 0
    max_backlog: int = 0
    busy_s: float = 0.0
    cpu_s: float = 0.0
    foreign_cpu_share: float = 0.0
    waited_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def achieved_rate(self) -> float:
        return self.changes / self.elapsed_s if self.elapsed_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "impl": self.impl,
            "target_rate": self.target_rate,
            "achieved_rate": self.achieved_rate,
            "changes": self.changes,
            "elapsed_s": self.elapsed_s,
            "checkpoints": len(self.latencies_s),
            "skipped_checkpoints": self.skipped_checkpoints,
            "max_backlog_changes": self.max_backlog,
            "busy_fraction": self.busy_s / self.elapsed_s if self.elapsed_s else 0.0,
            "cpu_s": self.cpu_s,
            "foreign_cpu_share": self.foreign_cpu_share,
            "waited_s": self.waited_s,
            "latency": latency_summary(self.latencies_s),
            "warmup_checkpoints": len(self.warmup_latencies_s),
            "warmup_max_ms": max(self.warmup_latencies_s, default=0.0) * 1000,
            **self.extra,
        }


def paced(impl: str, rate: float, duration: float, append_batch: AppendBatch,
          checkpoint: Checkpoint, own_pids: list[int]) -> PacedRun:
    """Append at ``rate`` changes/s for ``duration`` s, a checkpoint every 100 ms.

    Each change is due at ``start + n / rate``; whatever is due is appended at
    once, then the loop sleeps (at most ``TICK_S``) until the next change or
    checkpoint is due. A checkpoint that blocks delays appends; they catch up.
    """
    run = PacedRun(impl, rate, duration)
    gc.collect()
    foreign = ForeignLoad(own_pids)
    cpu0 = time.process_time()
    start = time.perf_counter()
    end = start + duration
    next_checkpoint = start + CHECKPOINT_INTERVAL_S
    done = 0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        due = int((now - start) * rate)
        if due > done:
            run.max_backlog = max(run.max_backlog, due - done)
            append_batch(done, due - done)
            done = due
        if now >= next_checkpoint:
            warming = now - start < WARMUP_S
            (run.warmup_latencies_s if warming else run.latencies_s).append(checkpoint())
            next_checkpoint += CHECKPOINT_INTERVAL_S
            while next_checkpoint <= time.perf_counter():
                next_checkpoint += CHECKPOINT_INTERVAL_S
                run.skipped_checkpoints += 1
        after = time.perf_counter()
        run.busy_s += after - now
        next_change = start + (done + 1) / rate
        pause = min(TICK_S, next_change - after, next_checkpoint - after)
        if pause > 0:
            time.sleep(pause)
    run.elapsed_s = time.perf_counter() - start
    run.changes = done
    run.cpu_s = time.process_time() - cpu0
    run.foreign_cpu_share = foreign.share()
    return run


def run_ours(broker: Broker, duration: float) -> PacedRun:
    config = broker.changelog_config(
        unique_topic("latency-ours"), preemptive_persist_threshold_bytes=THRESHOLD_BYTES
    )
    data = payloads(PAYLOAD_BYTES)
    mask = MAX_PARALLELISM - 1
    with KafkaChangelogStorage(config) as storage:
        writer = storage.create_writer("bench", KeyGroupRange.of(0, MAX_PARALLELISM - 1))
        append = writer.append
        prev = [writer.next_sequence_number()]
        left_for_checkpoint: list[int] = []
        call_s: list[float] = []

        def append_batch(first: int, count: int) -> None:
            for i in range(first, first + count):
                kg = i & mask
                append(kg, data[kg])

        def checkpoint() -> float:
            checkpoint_id = len(left_for_checkpoint) + 1
            t0 = time.perf_counter()
            sqn = writer.next_sequence_number()
            # Bytes preemptive persistence has not handed over yet: what this persist uploads.
            left_for_checkpoint.append(writer.unpersisted_bytes)
            future = writer.persist(prev[0], checkpoint_id)
            call_s.append(time.perf_counter() - t0)
            result = future.result(timeout=120)
            latency = time.perf_counter() - t0
            if result.job_owned is None:
                raise RuntimeError(f"checkpoint {checkpoint_id} persisted nothing")
            writer.truncate(sqn)
            prev[0] = sqn
            return latency

        waited = wait_for_quiet(broker.pids())["waited_s"]
        run = paced("kafka_changelog", RATE, duration, append_batch, checkpoint, broker.pids())
        run.waited_s = waited
        writer.close()
    run.extra = {
        "preemptive_threshold_bytes": THRESHOLD_BYTES,
        "mean_bytes_left_for_checkpoint": (
            sum(left_for_checkpoint) / len(left_for_checkpoint) if left_for_checkpoint else 0.0
        ),
        "mean_bytes_per_checkpoint_interval": RATE * PAYLOAD_BYTES * CHECKPOINT_INTERVAL_S,
        # The synchronous part of the latency: rollover, encoding and producing the records.
        "persist_call": latency_summary(call_s),
    }
    return run


def run_raw(broker: Broker, duration: float) -> PacedRun:
    topic = broker.create_topic(unique_topic("latency-raw"))
    data = payloads(PAYLOAD_BYTES)
    keys = [kg.to_bytes(2, "big") for kg in range(MAX_PARALLELISM)]
    partition_of = [kg * PARTITIONS // MAX_PARALLELISM for kg in range(MAX_PARALLELISM)]
    errors: list[KafkaError] = []
    producer = Producer({**broker.raw_producer_settings(topic), "error_cb": errors.append})
    produce = producer.produce
    mask = MAX_PARALLELISM - 1

    def append_batch(first: int, count: int) -> None:
        for i in range(first, first + count):
            kg = i & mask
            while True:
                try:
                    produce(topic, data[kg], keys[kg], partition_of[kg])
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.poll(0)

    def checkpoint() -> float:
        t0 = time.perf_counter()
        left = producer.flush(120)
        latency = time.perf_counter() - t0
        if left:
            raise RuntimeError(f"raw producer: {left} records not delivered in 120 s")
        return latency

    waited = wait_for_quiet(broker.pids())["waited_s"]
    run = paced("raw_producer", RATE, duration, append_batch, checkpoint, broker.pids())
    run.waited_s = waited
    producer.flush(120)
    landed = broker.record_count(topic)
    if landed != run.changes:
        raise RuntimeError(f"raw producer: {landed} of {run.changes} records landed ({errors})")
    run.extra = {"verified_records": landed}
    return run


def run(broker: Broker) -> dict[str, Any]:
    duration = scaled(DURATION_S, minimum=2.0)
    print(f"\n[persist latency] {RATE:,} x {PAYLOAD_BYTES}-byte changes/s for {duration:.0f} s, "
          f"checkpoint every {CHECKPOINT_INTERVAL_S * 1000:.0f} ms", flush=True)
    # Warm-up (not measured): idempotence PIDs, connections, JIT of the broker.
    run_raw(broker, 1.0)
    run_ours(broker, 1.0)
    ours = run_ours(broker, duration)
    raw = run_raw(broker, duration)
    results: dict[str, Any] = {
        "name": "persist_latency",
        "payload_bytes": PAYLOAD_BYTES,
        "target_rate": RATE,
        "duration_s": duration,
        "checkpoint_interval_s": CHECKPOINT_INTERVAL_S,
        "kafka_changelog": ours.as_dict(),
        "raw_producer": raw.as_dict(),
    }
    ratio = ours.as_dict()["latency"]["p99_9_ms"] / raw.as_dict()["latency"]["p99_9_ms"]
    results["p99_9_ratio"] = ratio
    results["p50_ratio"] = (
        ours.as_dict()["latency"]["p50_ms"] / raw.as_dict()["latency"]["p50_ms"]
    )
    results["target_p99_9_ratio"] = TARGET_P999_RATIO
    results["verdict"] = verdict(ratio <= TARGET_P999_RATIO)
    results["sustained"] = ours.achieved_rate >= 0.98 * RATE
    return results


def report(results: dict[str, Any]) -> str:
    rows = []
    for key, label in (("kafka_changelog", "ours: persist"), ("raw_producer", "raw: flush")):
        side = results[key]
        lat = side["latency"]
        rows.append([
            label, f"{side['achieved_rate']:,.0f}", f"{int(lat['samples'])}",
            f"{lat['p50_ms']:.1f}", f"{lat['p99_ms']:.1f}", f"{lat['p99_9_ms']:.1f}",
            f"{lat['max_ms']:.1f}", f"{side.get('warmup_max_ms', 0.0):.1f}",
            f"{side['busy_fraction'] * 100:.0f}%",
            f"{side['foreign_cpu_share']:.0%}",
        ])
    text = table(
        ["", "changes/s", "n", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "warm-up max ms",
         "busy", "others' CPU"],
        rows,
    )
    ours = results["kafka_changelog"]
    text += (
        f"\np99.9 ratio ours/raw: {ratio_text(results['p99_9_ratio'])} "
        f"(target <= {results['target_p99_9_ratio']}x): {results['verdict']}; "
        f"p50 ratio {ratio_text(results['p50_ratio'])}"
        f"\nrate: {ours['achieved_rate']:,.0f} of {results['target_rate']:,} changes/s "
        f"{'sustained' if results['sustained'] else 'NOT sustained'}; "
        f"persist handed over {ours['mean_bytes_left_for_checkpoint'] / 1024:.0f} KiB on average "
        f"(of {ours['mean_bytes_per_checkpoint_interval'] / 1024:.0f} KiB per interval; "
        f"the rest went out preemptively); inside persist() itself (encode + produce): "
        f"p50 {ours['persist_call']['p50_ms']:.1f} ms, p99 {ours['persist_call']['p99_ms']:.1f} ms"
    )
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args(argv)
    with kafka_broker() as broker:
        results = run(broker)
        results["machine"] = machine_info()
    print(f"\npersist latency (p99.9 of ~200 samples is close to the maximum; the "
          f"checkpoints of each run's first {WARMUP_S:g} s reported apart)")
    print(report(results))
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
