"""Peak memory of a writer while the broker is stalled, against the documented bound.

On a fresh single-node broker, a writer with preemptive-persist threshold T
(5 MiB) and in-flight bound M (20 MiB), ``append_timeout_s=3``, warms up, then
the broker is frozen (SIGSTOP) and the writer appends 1-KiB changes until
``BackpressureTimeoutError``. A thread samples the process RSS every 20 ms;
peak minus baseline (RSS after warm-up) must stay within T + M + 50 MiB. Then
the broker is resumed and a final persist must succeed.

Needs the local broker (it pauses it): skipped when ``KAFKA_BOOTSTRAP_SERVERS`` is set.

Run: ``python -m benchmarks.bench_memory_stalled [--json FILE]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import (
    EXTERNAL_ENV,
    MAX_PARALLELISM,
    MiB,
    kafka_broker,
    machine_info,
    payloads,
    table,
    unique_topic,
    verdict,
    write_json,
)
from kafka_changelog import BackpressureTimeoutError, KeyGroupRange
from kafka_changelog.kafka import KafkaChangelogStorage

PAYLOAD_BYTES = 1024
THRESHOLD_BYTES = 5 * MiB
MAX_IN_FLIGHT_BYTES = 20 * MiB
SLACK_BYTES = 50 * MiB
APPEND_TIMEOUT_S = 3.0
SAMPLE_INTERVAL_S = 0.02
WARMUP_BYTES = 4 * THRESHOLD_BYTES  # through the broker before the baseline is taken
WARMUP_CHECKPOINT_BYTES = 2 * MiB
#: Safety stop: appending this much while stalled without backpressure fails the bench.
RUNAWAY_BYTES = 20 * (THRESHOLD_BYTES + MAX_IN_FLIGHT_BYTES)
RESUME_ATTEMPTS = 10


class RssSampler(threading.Thread):
    """Samples this process's resident set size every ``interval`` seconds."""

    def __init__(self, interval: float = SAMPLE_INTERVAL_S) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self._process = psutil.Process(os.getpid())
        self._interval = interval
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self.samples = 0
        self.peak = 0

    def rss(self) -> int:
        return int(self._process.memory_info().rss)

    def reset_peak(self) -> int:
        """Start a new peak from the current RSS, which is returned."""
        current = self.rss()
        with self._lock:
            self.peak = current
        return current

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            current = self.rss()
            with self._lock:
                self.samples += 1
                self.peak = max(self.peak, current)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def run() -> dict[str, Any]:
    data = payloads(PAYLOAD_BYTES)
    mask = MAX_PARALLELISM - 1
    results: dict[str, Any] = {
        "name": "memory_stalled",
        "payload_bytes": PAYLOAD_BYTES,
        "threshold_bytes": THRESHOLD_BYTES,
        "max_in_flight_bytes": MAX_IN_FLIGHT_BYTES,
        "append_timeout_s": APPEND_TIMEOUT_S,
        "bound_bytes": THRESHOLD_BYTES + MAX_IN_FLIGHT_BYTES + SLACK_BYTES,
        "sample_interval_s": SAMPLE_INTERVAL_S,
    }
    print(f"\n[memory, stalled broker] 1-KiB changes, T={THRESHOLD_BYTES // MiB} MiB, "
          f"M={MAX_IN_FLIGHT_BYTES // MiB} MiB, append timeout {APPEND_TIMEOUT_S:.0f} s",
          flush=True)
    with kafka_broker() as broker:
        cluster = broker.cluster
        assert cluster is not None
        config = broker.changelog_config(
            unique_topic("memory"),
            preemptive_persist_threshold_bytes=THRESHOLD_BYTES,
            max_in_flight_bytes=MAX_IN_FLIGHT_BYTES,
            append_timeout_s=APPEND_TIMEOUT_S,
        )
        sampler = RssSampler()
        sampler.start()
        with KafkaChangelogStorage(config) as storage:
            writer = storage.create_writer("bench", KeyGroupRange.of(0, MAX_PARALLELISM - 1))
            prev = writer.next_sequence_number()
            checkpoint = 0
            # Warm-up with the broker running: normal checkpoints, truncated after each.
            for i in range(WARMUP_BYTES // PAYLOAD_BYTES):
                writer.append(i & mask, data[i & mask])
                if (i + 1) % (WARMUP_CHECKPOINT_BYTES // PAYLOAD_BYTES) == 0:
                    checkpoint += 1
                    sqn = writer.next_sequence_number()
                    writer.persist(prev, checkpoint).result(timeout=60)
                    writer.truncate(sqn)
                    prev = sqn
            gc.collect()
            time.sleep(0.5)
            baseline = sampler.reset_peak()
            print(f"  baseline RSS after warm-up ({WARMUP_BYTES // MiB} MiB persisted): "
                  f"{baseline / MiB:.1f} MiB", flush=True)

            cluster.pause_node(0)
            paused_at = time.perf_counter()
            appended = 0
            error: BackpressureTimeoutError | None = None
            try:
                while appended * PAYLOAD_BYTES < RUNAWAY_BYTES:
                    kg = appended & mask
                    try:
                        writer.append(kg, data[kg])
                    except BackpressureTimeoutError as exc:
                        error = exc
                        break
                    appended += 1
                stalled_s = time.perf_counter() - paused_at
                in_flight = storage.producer.in_flight_bytes
                unpersisted = writer.unpersisted_bytes
                time.sleep(5 * SAMPLE_INTERVAL_S)  # let the sampler see the final state
                peak = sampler.peak
            finally:
                cluster.resume_node(0)
            print(f"  broker paused {stalled_s:.1f} s: {appended:,} changes "
                  f"({appended * PAYLOAD_BYTES / MiB:.1f} MiB) appended, then "
                  f"{'BackpressureTimeoutError' if error else 'NO backpressure'}; in flight "
                  f"{in_flight / MiB:.1f} MiB, unpersisted {unpersisted / MiB:.1f} MiB",
                  flush=True)

            # Resumed: the final persist must make everything durable.
            checkpoint += 1
            sqn = writer.next_sequence_number()
            resumed_at = time.perf_counter()
            persist_error = ""
            attempts = 0
            persisted = False
            while attempts < RESUME_ATTEMPTS and not persisted:
                attempts += 1
                try:
                    result = writer.persist(prev, checkpoint).result(timeout=120)
                    persisted = result.job_owned is not None
                except BackpressureTimeoutError as exc:  # acks not back yet: retry
                    persist_error = str(exc)
                except Exception as exc:  # report any other failure as a failed persist
                    persist_error = f"{type(exc).__name__}: {exc}"
                    break
            final_persist_s = time.perf_counter() - resumed_at
            if persisted:
                writer.truncate(sqn)
            writer.close()
        # Free the storage's clients before the broker stops (they hold reference cycles).
        del writer, storage
        gc.collect()
        time.sleep(5 * SAMPLE_INTERVAL_S)
        overall_peak = sampler.peak  # the final persist re-uploads while acks drain
        after = sampler.rss()
        sampler.stop()
    growth = max(peak, overall_peak) - baseline
    results.update({
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": max(peak, overall_peak),
        "peak_rss_stalled_bytes": peak,
        "peak_rss_until_final_persist_bytes": overall_peak,
        "growth_bytes": growth,
        "rss_after_bytes": after,
        "rss_samples": sampler.samples,
        "appended_while_stalled": appended,
        "appended_bytes_while_stalled": appended * PAYLOAD_BYTES,
        "stalled_s": stalled_s,
        "backpressure_error": str(error) if error else None,
        "in_flight_bytes_at_error": in_flight,
        "unpersisted_bytes_at_error": unpersisted,
        "final_persist_ok": persisted,
        "final_persist_attempts": attempts,
        "final_persist_s": final_persist_s,
        "final_persist_error": persist_error if not persisted else None,
    })
    within = growth <= results["bound_bytes"]
    results["within_bound"] = within
    results["verdict"] = verdict(within and persisted and error is not None)
    return results


def report(results: dict[str, Any]) -> str:
    if results.get("skipped"):
        return f"skipped: {results['skipped']}"
    rows = [[
        f"{results['baseline_rss_bytes'] / MiB:.1f}",
        f"{results['peak_rss_bytes'] / MiB:.1f}",
        f"{results['growth_bytes'] / MiB:.1f}",
        f"<= {results['bound_bytes'] / MiB:.0f}",
        f"{results['appended_bytes_while_stalled'] / MiB:.1f}",
        "ok" if results["final_persist_ok"] else "FAILED",
        results["verdict"],
    ]]
    return table(
        ["baseline MiB", "peak MiB", "growth MiB", "bound T+M+50", "appended MiB",
         "persist after resume", "result"],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args(argv)
    if os.environ.get(EXTERNAL_ENV):
        results: dict[str, Any] = {
            "name": "memory_stalled",
            "skipped": f"{EXTERNAL_ENV} is set: an external broker cannot be paused",
        }
    else:
        results = run()
    results["machine"] = machine_info()
    print("\nmemory while the broker is stalled (RSS, sampled every 20 ms)")
    print(report(results))
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
