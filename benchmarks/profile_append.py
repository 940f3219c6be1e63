"""Where the time of the 100-byte append + persist path goes (for optimising the writer).

Two parts, against a fresh local broker (or ``KAFKA_BOOTSTRAP_SERVERS``):

1. a timing split without a profiler: microseconds per change spent in
   ``append`` versus in ``persist()`` (encoding and producing the records) versus
   waiting for the acks, with a checkpoint every 10,000 changes;
2. cProfile of the same loop, top functions by own time.

Run: ``python -m benchmarks.profile_append [--out FILE]`` (default
``benchmarks/results/profile_append_100b.txt``; ``BENCH_SCALE`` scales the counts).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

from benchmarks.common import (
    MAX_PARALLELISM,
    RESULTS_DIR,
    Broker,
    ForeignLoad,
    kafka_broker,
    machine_info,
    payloads,
    scaled,
    unique_topic,
    wait_for_quiet,
)
from kafka_changelog import KeyGroupRange
from kafka_changelog.kafka import KafkaChangelogStorage

PAYLOAD_BYTES = 100
CHANGES_PER_CHECKPOINT = 10_000  # ~100 ms of appends at 100k changes/s


def loop(broker: Broker, count: int, profiler: cProfile.Profile | None) -> dict[str, float]:
    """Append ``count`` changes, persist + truncate every 10,000; seconds per phase."""
    config = broker.changelog_config(unique_topic("profile"))
    data = payloads(PAYLOAD_BYTES)
    mask = MAX_PARALLELISM - 1
    phases = {"append": 0.0, "persist_call": 0.0, "ack_wait": 0.0, "truncate": 0.0}
    with KafkaChangelogStorage(config) as storage:
        writer = storage.create_writer("bench", KeyGroupRange.of(0, MAX_PARALLELISM - 1))
        append = writer.append
        prev = writer.next_sequence_number()
        if profiler is not None:
            profiler.enable()
        for checkpoint, first in enumerate(range(0, count, CHANGES_PER_CHECKPOINT), start=1):
            t0 = time.perf_counter()
            for i in range(first, min(count, first + CHANGES_PER_CHECKPOINT)):
                kg = i & mask
                append(kg, data[kg])
            t1 = time.perf_counter()
            sqn = writer.next_sequence_number()
            future = writer.persist(prev, checkpoint)
            t2 = time.perf_counter()
            future.result(timeout=120)
            t3 = time.perf_counter()
            writer.truncate(sqn)
            prev = sqn
            t4 = time.perf_counter()
            phases["append"] += t1 - t0
            phases["persist_call"] += t2 - t1
            phases["ack_wait"] += t3 - t2
            phases["truncate"] += t4 - t3
        if profiler is not None:
            profiler.disable()
        writer.close()
    return phases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "profile_append_100b.txt")
    parser.add_argument("--top", type=int, default=25, help="functions to list")
    args = parser.parse_args(argv)
    timed = int(scaled(500_000, minimum=20_000))
    profiled = int(scaled(200_000, minimum=20_000))
    out = io.StringIO()
    with kafka_broker() as broker:
        loop(broker, 20_000, None)  # warm-up: connections, idempotence PID
        wait_for_quiet(broker.pids())
        foreign = ForeignLoad(broker.pids())
        phases = loop(broker, timed, None)
        foreign_share = foreign.share()
        profiler = cProfile.Profile()
        loop(broker, profiled, profiler)
    total = sum(phases.values())
    info = machine_info()
    print(f"# 100-byte append + persist path ({info['date_utc']}, {info['cpus']} CPUs "
          f"{info['cpu_model']}, Python {info['python']}, load {info['load_average']})",
          file=out)
    print(f"\n## Timing split, {timed:,} changes, persist every {CHANGES_PER_CHECKPOINT:,} "
          f"(no profiler): {timed / total:,.0f} changes/s; other processes used "
          f"{foreign_share:.0%} of the CPUs meanwhile", file=out)
    for phase, seconds in phases.items():
        print(f"  {phase:13s} {seconds / timed * 1e6:6.2f} us/change  "
              f"{seconds / total * 100:5.1f} %", file=out)
    print(f"\n## cProfile, {profiled:,} changes, top {args.top} by own time", file=out)
    stats = pstats.Stats(profiler, stream=out)
    stats.strip_dirs().sort_stats(pstats.SortKey.TIME).print_stats(args.top)
    text = out.getvalue()
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
