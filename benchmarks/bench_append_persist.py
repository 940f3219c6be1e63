"""Throughput of append + persist against a raw producer writing one record per change.

For 100-byte and 10-KB changes, round robin over 128 key groups, a checkpoint
every 100 ms (checked between appends in the appending thread, waited for,
then truncated), the writer's throughput is compared with a raw confluent-kafka
``Producer`` with the storage's settings but a 5 ms linger (its best:
``Broker.raw_producer_settings``), producing one record
per change to the key group's partition, polling regularly and flushing every
100 ms. The writer appends through ``append_all`` (what the keyed state backend
calls: ``BULK_CHANGES`` changes a call, the lists built once, as the backend has
them from encoding its ops) and, beside it, through the per-change ``append``.
All run against the same broker in the same process, each into a fresh topic,
alternating, ``--rounds`` times (default 3); the best (fastest) round of each
counts, the others are kept in the JSON. The target is about ``append_all``.

Run: ``python -m benchmarks.bench_append_persist [--json FILE]`` (``BENCH_SCALE``
scales the amount of data).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Any

from confluent_kafka import KafkaError, Producer

from benchmarks.common import (
    MAX_PARALLELISM,
    MB,
    PARTITIONS,
    Broker,
    ForeignLoad,
    kafka_broker,
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

CHECKPOINT_INTERVAL_S = 0.1
#: Changes per ``append_all`` call (a multiple of the 128 key groups: every call the same).
BULK_CHANGES = 1024
BULK = "kafka_changelog"
PER_CHANGE = "kafka_changelog_append"
#: (payload bytes, changes at BENCH_SCALE=1, appends between clock checks, target, metric)
CASES: tuple[tuple[int, int, int, float, str], ...] = (
    (100, 1_500_000, 256, 3.0, "changes_per_s"),
    (10 * 1024, 300_000, 2, 0.9, "mb_per_s"),
)


@dataclass
class Run:
    """One measured run of one implementation."""

    impl: str
    payload_bytes: int
    changes: int
    seconds: float
    checkpoints: int
    #: Seconds inside persist() (ours: encode + produce) or flush() (raw).
    persist_call_s: float
    #: Seconds waiting for the persist future after persist() returned (ours only).
    ack_wait_s: float
    verified_records: int
    #: CPU seconds of this process (all threads) during the run: less sensitive to
    #: other load on the machine than wall-clock time.
    cpu_s: float = 0.0
    #: Share of the machine's CPU used by other processes during the run (0.5 = a core).
    foreign_cpu_share: float = 0.0
    #: Seconds waited beforehand for other processes to quieten down.
    waited_s: float = 0.0

    @property
    def changes_per_s(self) -> float:
        return self.changes / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.changes * self.payload_bytes / self.seconds / MB

    @property
    def cpu_us_per_change(self) -> float:
        return self.cpu_s / self.changes * 1e6

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "changes_per_s": self.changes_per_s,
            "mb_per_s": self.mb_per_s,
            "cpu_us_per_change": self.cpu_us_per_change,
        }


def run_ours(broker: Broker, size: int, count: int, check_every: int,
             bulk: bool = True) -> Run:
    """Append ``count`` changes with a persist + truncate every 100 ms: through
    ``append_all`` (``bulk``) or one ``append`` per change."""
    config = broker.changelog_config(unique_topic("ours"))
    data = payloads(size)
    mask = MAX_PARALLELISM - 1
    bulk_groups = [i & mask for i in range(BULK_CHANGES)]
    bulk_payloads = [data[kg] for kg in bulk_groups]
    with KafkaChangelogStorage(config) as storage:
        writer = storage.create_writer("bench", KeyGroupRange.of(0, MAX_PARALLELISM - 1))
        append, append_all = writer.append, writer.append_all
        prev = writer.next_sequence_number()
        checkpoint = 0
        call_s = wait_s = 0.0
        step = BULK_CHANGES if bulk else 1
        check_every = max(1, check_every // step) * step
        gc.collect()
        foreign = ForeignLoad(broker.pids())
        cpu0 = time.process_time()
        start = last = time.perf_counter()
        for i in range(0, count, step):
            if bulk:
                take = min(step, count - i)
                if take == step:
                    append_all(bulk_groups, bulk_payloads)
                else:
                    append_all(bulk_groups[:take], bulk_payloads[:take])
            else:
                kg = i & mask
                append(kg, data[kg])
            if i % check_every == 0 or i + step >= count:
                now = time.perf_counter()
                if now - last >= CHECKPOINT_INTERVAL_S or i + step >= count:
                    checkpoint += 1
                    sqn = writer.next_sequence_number()
                    t0 = time.perf_counter()
                    future = writer.persist(prev, checkpoint)
                    t1 = time.perf_counter()
                    result = future.result(timeout=120)
                    t2 = time.perf_counter()
                    if result.job_owned is None:
                        raise RuntimeError(f"checkpoint {checkpoint} persisted nothing")
                    writer.truncate(sqn)
                    prev = sqn
                    call_s += t1 - t0
                    wait_s += t2 - t1
                    last = t2
        seconds = time.perf_counter() - start
        cpu_s = time.process_time() - cpu0
        share = foreign.share()
        writer.close()
    broker.delete_topic(config.topic)
    return Run(BULK if bulk else PER_CHANGE, size, count, seconds, checkpoint, call_s, wait_s,
               0, cpu_s, share)


def run_per_change(broker: Broker, size: int, count: int, check_every: int) -> Run:
    """:func:`run_ours` through one ``append`` call per change."""
    return run_ours(broker, size, count, check_every, bulk=False)


def run_raw(broker: Broker, size: int, count: int, check_every: int) -> Run:
    """Produce ``count`` records (one per change) with the storage's producer settings."""
    topic = broker.create_topic(unique_topic("raw"))
    data = payloads(size)
    keys = [kg.to_bytes(2, "big") for kg in range(MAX_PARALLELISM)]
    partition_of = [kg * PARTITIONS // MAX_PARALLELISM for kg in range(MAX_PARALLELISM)]
    errors: list[KafkaError] = []
    producer = Producer({**broker.raw_producer_settings(topic), "error_cb": errors.append})
    produce = producer.produce
    checkpoint = 0
    flush_s = 0.0
    mask = MAX_PARALLELISM - 1
    gc.collect()
    foreign = ForeignLoad(broker.pids())
    cpu0 = time.process_time()
    start = last = time.perf_counter()
    for i in range(count):
        kg = i & mask
        while True:
            try:
                produce(topic, data[kg], keys[kg], partition_of[kg])
                break
            except BufferError:  # librdkafka's queue is full: let it drain
                producer.poll(0.01)
        if i % check_every == 0 or i == count - 1:
            producer.poll(0)
            now = time.perf_counter()
            if now - last >= CHECKPOINT_INTERVAL_S or i == count - 1:
                checkpoint += 1
                t0 = time.perf_counter()
                left = producer.flush(120)
                last = time.perf_counter()
                flush_s += last - t0
                if left:
                    raise RuntimeError(f"raw producer: {left} records not delivered in 120 s")
    seconds = time.perf_counter() - start
    cpu_s = time.process_time() - cpu0
    share = foreign.share()
    del producer, produce
    landed = broker.record_count(topic)
    if landed != count:
        raise RuntimeError(f"raw producer: {landed} of {count} records landed ({errors})")
    broker.delete_topic(topic)
    return Run("raw_producer", size, count, seconds, checkpoint, flush_s, 0.0, landed, cpu_s,
               share)


def run(broker: Broker, rounds: int = 3) -> dict[str, Any]:
    """All cases, ``rounds`` alternating rounds each; returns the JSON-able results."""
    cases: list[dict[str, Any]] = []
    # Warm-up (not measured): the first producer of a fresh broker waits for its
    # idempotence PID while the broker's coordinators load, which would be charged to
    # whichever side ran first.
    for size, _, check_every, _, _ in CASES:
        warm = max(2_000, 2_000_000 // size)
        run_raw(broker, size, warm, check_every)
        run_ours(broker, size, warm, check_every)
        run_per_change(broker, size, warm, check_every)
    for size, base_count, check_every, target, metric in CASES:
        count = int(scaled(base_count, minimum=2_000))
        print(f"\n[append+persist] {size}-byte changes x {count:,} "
              f"({count * size / MB:,.0f} MB), {rounds} round(s)", flush=True)
        runs: list[Run] = []
        for index in range(rounds):
            # Alternate the order so neither side always runs on a warmer broker.
            order = ((run_raw, run_ours, run_per_change) if index % 2 == 0
                     else (run_ours, run_per_change, run_raw))
            for bench in order:
                waited = wait_for_quiet(broker.pids())["waited_s"]
                result = bench(broker, size, count, check_every)
                result.waited_s = waited
                runs.append(result)
                print(f"  round {index + 1} {result.impl:16s} {result.changes_per_s:>12,.0f} "
                      f"changes/s {result.mb_per_s:>8.1f} MB/s  ({result.seconds:.1f} s, "
                      f"{result.checkpoints} checkpoints, {result.persist_call_s:.1f} s in "
                      f"persist/flush, {result.cpu_us_per_change:.1f} CPU us/change, others "
                      f"used {result.foreign_cpu_share:.0%} of the CPUs)",
                      flush=True)
        ours_runs = [r for r in runs if r.impl == BULK]
        per_change_runs = [r for r in runs if r.impl == PER_CHANGE]
        raw_runs = [r for r in runs if r.impl == "raw_producer"]
        ours = min(ours_runs, key=lambda r: r.seconds)
        per_change = min(per_change_runs, key=lambda r: r.seconds)
        raw = min(raw_runs, key=lambda r: r.seconds)
        # Same changes and bytes on both sides: the changes/s and MB/s ratios are equal.
        ratio = ours.changes_per_s / raw.changes_per_s
        median_ratio = median([r.changes_per_s for r in ours_runs]) / median(
            [r.changes_per_s for r in raw_runs])
        cases.append({
            "payload_bytes": size,
            "changes": count,
            "target_metric": metric,
            "target_ratio": target,
            "ratio": ratio,
            "median_ratio": median_ratio,
            "per_change_ratio": per_change.changes_per_s / raw.changes_per_s,
            "verdict": verdict(ratio >= target),
            "best": {BULK: ours.as_dict(), PER_CHANGE: per_change.as_dict(),
                     "raw_producer": raw.as_dict()},
            "runs": [r.as_dict() for r in runs],
        })
    return {
        "name": "append_persist",
        "checkpoint_interval_s": CHECKPOINT_INTERVAL_S,
        "partitions": PARTITIONS,
        "key_groups": MAX_PARALLELISM,
        "rounds": rounds,
        "cases": cases,
    }


def report(results: dict[str, Any]) -> str:
    rows = []
    for case in results["cases"]:
        ours = case["best"][BULK]
        raw = case["best"]["raw_producer"]
        metric = "changes/s" if case["target_metric"] == "changes_per_s" else "MB/s"
        rows.append([
            f"{case['payload_bytes']} B",
            f"{ours['changes_per_s']:,.0f}", f"{ours['mb_per_s']:.1f}",
            f"{raw['changes_per_s']:,.0f}", f"{raw['mb_per_s']:.1f}",
            ratio_text(case["ratio"]), ratio_text(case["median_ratio"]),
            ratio_text(case["per_change_ratio"]),
            f"{ours['cpu_us_per_change']:.1f} / {raw['cpu_us_per_change']:.1f}",
            f"{ours['foreign_cpu_share']:.0%} / {raw['foreign_cpu_share']:.0%}",
            f">= {case['target_ratio']}x {metric}", case["verdict"],
        ])
    return table(
        ["change", "ours chg/s", "ours MB/s", "raw chg/s", "raw MB/s", "ratio",
         "median ratio", "append() ratio", "CPU us/chg ours / raw", "others' CPU", "target",
         "result"],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results to this file")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per case")
    args = parser.parse_args(argv)
    with kafka_broker() as broker:
        results = run(broker, rounds=args.rounds)
        results["machine"] = machine_info()
    print("\nappend+persist throughput (best round of each side; ratio = ours through "
          "append_all / raw, the same for changes/s and MB/s; append() ratio: one append "
          "call per change / raw; MB = 10^6 payload bytes)")
    print(report(results))
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
