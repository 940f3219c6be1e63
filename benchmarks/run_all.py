"""Run every benchmark, print a combined summary, write ``benchmarks/results/latest.json``.

Each benchmark runs in its own Python process with its own fresh broker (the
memory benchmark needs a fresh process for a meaningful RSS baseline; the StateOp
codec benchmark needs no broker). Other work on a 2-core machine distorts every
figure, so before each benchmark (and before each measured run inside them) the
suite waits, up to ``BENCH_QUIET_WAIT_S`` (default 120 s; 0: don't wait), until
other processes use less than ``BENCH_QUIET_SHARE`` (default 0.15) of the CPUs; the
share other processes used during each run is recorded next to its figures.

Usage: ``./benchmarks/run.sh`` (or ``python -m benchmarks.run_all``) with
``BENCH_SCALE`` (default 1.0; 0.1 for a smoke run). Exits non-zero only when a
benchmark crashes; missed targets are reported, not failed. ``--only spark_stateful``
runs the Spark-against-Spark streaming benchmark (not part of the default set: hours
at ``BENCH_SCALE=1``), with its users scaled by ``BENCH_SCALE`` too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import (
    bench_append_persist,
    bench_latency,
    bench_memory_stalled,
    bench_persist_latency,
    bench_restore,
    bench_spark_stateful,
    bench_state_ops,
    bench_state_table,
)
from benchmarks.common import (
    REPO_ROOT,
    RESULTS_DIR,
    machine_info,
    scale,
    wait_for_quiet,
    write_json,
)

BENCHMARKS = (
    ("append_persist", "benchmarks.bench_append_persist"),
    ("persist_latency", "benchmarks.bench_persist_latency"),
    ("memory_stalled", "benchmarks.bench_memory_stalled"),
    ("restore", "benchmarks.bench_restore"),
    ("state_ops", "benchmarks.bench_state_ops"),
    ("state_table", "benchmarks.bench_state_table"),
    ("latency", "benchmarks.bench_latency"),
)
#: Run only when named with ``--only`` (Spark against Spark: hours at BENCH_SCALE=1), with
#: their extra arguments: ``spark_stateful`` scales its users by BENCH_SCALE too.
OPTIONAL: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("spark_stateful", "benchmarks.bench_spark_stateful", ("--scale-users",)),
)


def run_one(module: str, out: Path, extra: tuple[str, ...] = ()
            ) -> tuple[dict[str, Any] | None, str]:
    """Run one benchmark module in a subprocess; its results, or None and why."""
    command = [sys.executable, "-m", module, "--json", str(out), *extra]
    started = time.monotonic()
    code = subprocess.call(command, cwd=REPO_ROOT)
    elapsed = time.monotonic() - started
    if code != 0:
        return None, f"{module} exited with {code} after {elapsed:.0f} s"
    results: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    results["wall_s"] = round(elapsed, 1)
    return results, ""


def summary(results: dict[str, Any]) -> str:
    lines = []
    for key, module in (
        ("append_persist", bench_append_persist),
        ("persist_latency", bench_persist_latency),
        ("memory_stalled", bench_memory_stalled),
        ("restore", bench_restore),
        ("state_ops", bench_state_ops),
        ("state_table", bench_state_table),
        ("latency", bench_latency),
    ):
        lines.append(f"\n== {key} ==")
        found = results["benchmarks"].get(key)
        if found is None:
            lines.append(f"FAILED: {results['errors'].get(key, 'no result')}")
        else:
            lines.append(module.report(found))
    for key, _, _ in OPTIONAL:
        if key in results["benchmarks"]:
            lines.append(f"\n== {key} ==")
            lines.append(bench_spark_stateful.report(results["benchmarks"][key]))
        elif key in results["errors"]:
            lines.append(f"\n== {key} ==\nFAILED: {results['errors'][key]}")
    machine = results["machine"]
    lines.append(
        f"\nmachine: {machine['cpus']} CPUs {machine['cpu_model']}, {machine['memory_gib']} GiB, "
        f"Python {machine['python']}, confluent-kafka {machine['confluent_kafka']} "
        f"(librdkafka {machine['librdkafka']}), Kafka {machine['kafka']}, "
        f"BENCH_SCALE={machine['bench_scale']}, commit {machine['git_commit']}, "
        f"{machine['date_utc']}"
    )
    return "\n".join(lines)


def verdicts(results: dict[str, Any]) -> dict[str, str]:
    """One PASS/MISS/FAILED/SKIPPED per target."""
    found = results["benchmarks"]
    out: dict[str, str] = {}
    append = found.get("append_persist")
    for case in (append or {}).get("cases", []):
        out[f"append_persist_{case['payload_bytes']}B"] = case["verdict"]
    if append is None:
        out["append_persist"] = "FAILED"
    latency = found.get("persist_latency")
    out["persist_latency_p99_9"] = latency["verdict"] if latency else "FAILED"
    memory = found.get("memory_stalled")
    if memory is None:
        out["memory_stalled"] = "FAILED"
    else:
        out["memory_stalled"] = "SKIPPED" if memory.get("skipped") else memory["verdict"]
    end_to_end = found.get("latency")
    out["latency_p99_vs_spark"] = (end_to_end.get("result", "FAILED") if end_to_end
                                   else "FAILED")
    stateful = found.get("spark_stateful")
    if stateful is not None:
        for target in stateful["targets"]:
            key = f"spark_stateful_{target['side']}: {target['target']} ({target['case']})"
            out[key] = target["verdict"]
    elif "spark_stateful" in results["errors"]:
        out["spark_stateful"] = "FAILED"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "latest.json",
                        help="where to write the combined results")
    parser.add_argument("--only", action="append",
                        choices=[name for name, _ in BENCHMARKS]
                        + [name for name, _, _ in OPTIONAL],
                        help="run only this benchmark (repeatable; "
                             f"{', '.join(name for name, _, _ in OPTIONAL)} run only so)")
    args = parser.parse_args(argv)
    print(f"benchmarks at BENCH_SCALE={scale()}", flush=True)
    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": machine_info(),
        "quiet_waits": {},
        "benchmarks": {},
        "errors": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        chosen: list[tuple[str, str, tuple[str, ...]]] = [
            (name, module, ()) for name, module in BENCHMARKS
            if not args.only or name in args.only]
        chosen += [entry for entry in OPTIONAL if args.only and entry[0] in args.only]
        for name, module, extra in chosen:
            results["quiet_waits"][name] = wait_for_quiet(label=f"[{name}] ")
            found, error = run_one(module, Path(scratch) / f"{name}.json", extra)
            if found is None:
                results["errors"][name] = error
                print(f"\n!! {error}", flush=True)
            else:
                results["benchmarks"][name] = found
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["total_wall_s"] = round(time.monotonic() - started, 1)
    results["verdicts"] = verdicts(results)
    write_json(args.json, results)
    print("\n================ summary ================")
    print(summary(results))
    print("\ntargets: " + ", ".join(f"{k}={v}" for k, v in results["verdicts"].items()))
    print(f"results written to {args.json}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
