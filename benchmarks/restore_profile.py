"""Where the time of restoring 100-byte changes goes (``KafkaChangelogReader.read``).

Writes N 100-byte changes round robin over 128 key groups (one persist, as
``bench_restore``), then against a fresh local broker (or ``KAFKA_BOOTSTRAP_SERVERS``):

1. a timed read without a profiler (changes/s, CPU seconds);
2. cProfile of a second read, top functions by own time.

Run: ``python -m benchmarks.restore_profile [--out FILE] [--top N]`` (prints the
report; ``--out`` also writes it; ``BENCH_SCALE`` scales the count).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

from benchmarks.bench_restore import write_handle
from benchmarks.common import MB, kafka_broker, machine_info, scaled
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogHandle, KafkaChangelogReader

PAYLOAD_BYTES = 100


def read_all(
    config: KafkaChangelogConfig, handle: KafkaChangelogHandle, profiler: cProfile.Profile | None
) -> tuple[int, int, float, float]:
    """Changes, value bytes, wall and CPU seconds of reading ``handle`` once."""
    changes = 0
    cpu0 = time.process_time()
    start = time.perf_counter()
    with KafkaChangelogReader(config) as reader:
        if profiler is not None:
            profiler.enable()
        for _ in reader.read(handle):
            changes += 1
        if profiler is not None:
            profiler.disable()
    return (changes, reader.bytes_read, time.perf_counter() - start,
            time.process_time() - cpu0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--top", type=int, default=15, help="functions to list")
    args = parser.parse_args(argv)
    count = int(scaled(500_000, minimum=50_000))
    out = io.StringIO()
    with kafka_broker() as broker:
        config, handle, _ = write_handle(broker, PAYLOAD_BYTES, count)
        read_all(config, handle, None)  # warm-up
        changes, value_bytes, seconds, cpu_s = read_all(config, handle, None)
        profiler = cProfile.Profile()
        read_all(config, handle, profiler)
    info = machine_info()
    print(f"# restore of 100-byte changes ({info['date_utc']}, {info['cpus']} CPUs "
          f"{info['cpu_model']}, Python {info['python']}, load {info['load_average']})",
          file=out)
    print(f"\n## Timed read (no profiler): {changes:,} changes, {value_bytes / MB:.1f} MB of "
          f"record values in {seconds:.2f} s: {changes / seconds:,.0f} changes/s, "
          f"{value_bytes / seconds / MB:.1f} MB/s, {cpu_s / changes * 1e6:.2f} CPU us/change",
          file=out)
    print(f"\n## cProfile of KafkaChangelogReader.read, top {args.top} by own time", file=out)
    stats = pstats.Stats(profiler, stream=out)
    stats.strip_dirs().sort_stats(pstats.SortKey.TIME).print_stats(args.top)
    text = out.getvalue()
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
