"""Sessionization: ours against Spark's stateful operators with event time and TTL (#24).

The sessions job (:mod:`examples.sessions`'s, with a per-user counter in a TTL'd value
state instead of the list of pages): a user's session closes 30 minutes (event time)
after its last click, by an event-time timer once the watermark passes it (or by the
user's next click, when that comes first), and is emitted as ``user, start, end,
clicks``. Workload, watermark and checks: :mod:`benchmarks.sessions_workload`.

Sides: ours per key and vectorised, each with timers and TTL, without TTL, and without
either (:mod:`benchmarks.sessions_ours_sides`); Spark's ``applyInPandasWithState``
(``EventTimeTimeout``) and ``transformWithStateInPandas`` (``timeMode="EventTime"``,
value state with TTL) (:mod:`benchmarks.sessions_spark_sides`), on the pinned PySpark
and, in a separate virtualenv (``benchmarks/spark_newest_venv.sh``), on the newest
release (``--newest-python``). The method is ``bench_spark_stateful``'s (its
``run_side`` and ``analyse_side``): one Parquet file per micro-batch
(``maxFilesPerTrigger=1``), a child process group per side killed with SIGKILL before
the last batch and restarted on the same checkpoint; batch time is Spark's
``durationMs.triggerExecution``; every batch's outputs are checked against the model's
checksum, and the final state of a sample of users (clicks counted, open session)
against the model's.

Targets, per case: ours (per key, vectorised) median <= 0.3x the faster Spark
operator's median, whichever release was faster (issue #24), and our first batch after
kill -9 <= 0.3x the faster Spark operator's first batch after kill -9 (issue #40).
Reported beside them: p90, the cost of TTL bookkeeping (median with TTL minus without)
and of timers per due timer ((median with timers - median without) / median timers
fired per batch).

Run: ``python -m benchmarks.bench_sessions [--users 10000,200000] [--batches 6]
[--warmup 2] [--sides a,b] [--json FILE]``; results in
``benchmarks/results/sessions.json``. Exits non-zero when a side crashed or a check
failed (missed targets do not).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks.bench_spark_stateful import (
    MIN_EVENTS_PER_BATCH,
    Case,
    _ms,
    _target,
    add_run_options,
    analyse_side,
    finish,
    parse_cases,
    run_side,
    side_lines,
    target_lines,
)
from benchmarks.common import (
    REPO_ROOT,
    RESULTS_DIR,
    kafka_broker,
    ratio_text,
    scaled,
    table,
)
from benchmarks.sessions_ours_sides import SIDES as OUR_SIDES
from benchmarks.sessions_spark_sides import SIDES as SPARK_SIDES
from benchmarks.sessions_workload import (
    CHECKSUM_SQL,
    INPUT_SCHEMA,
    SOURCE_SELECT,
    TIMERS,
    expected_checksums,
    expected_state,
    step_ms,
    with_event_time,
)
from benchmarks.stateful_registry import OURS, SPARK, Side
from benchmarks.stateful_workload import (
    MEASURED,
    WorkloadShape,
    generate,
    sample_permille,
    write_files,
)

DEFAULT_JSON = RESULTS_DIR / "sessions.json"
DEFAULT_USERS = "10000,200000"
EVENTS_PER_BATCH = 100_000
#: Each batch draws its clicks from this share of the users (a new random pool each
#: batch): the others go quiet, and their sessions close.
ACTIVE_SHARE = 0.5
NEWEST_PYTHON = REPO_ROOT / ".venv-spark-newest" / "bin" / "python"
FASTER_SPARK_MAX = 0.3
#: Issue #40: our first batch after kill -9 against the faster Spark operator's.
RESTART_MAX = 0.3
SIDES: dict[str, Side] = {**OUR_SIDES, **SPARK_SIDES}
#: Spark's sessions: no-data batches off, so that batch N's watermark is the one from the
#: batches before N on every side (ours runs no batch without data).
SESSION_CONFIG = {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}


@dataclass
class SessionsCase(Case):
    """A case of the sessions workload: expected outputs and state with and without
    timers, and how many sessions timers close per batch."""

    states: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    due_timers: dict[int, int] = field(default_factory=dict)
    #: Per kind of outputs, whether every side's final state of the sample was the same.
    equal: dict[str, bool] = field(default_factory=dict)

    def expected_state(self, outputs: str) -> dict[str, list[Any]]:
        return self.states[outputs]


@dataclass(frozen=True)
class Run:
    """One side on one interpreter (Spark's sides run on both releases)."""

    name: str
    side: Side
    python: str
    spark: str


def spark_version_of(python: str) -> str | None:
    """The PySpark release of an interpreter (None: none there)."""
    try:
        out = subprocess.run([python, "-c", "import pyspark; print(pyspark.__version__)"],
                             capture_output=True, text=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def prepare(shape: WorkloadShape, directory: Path, sample: int) -> SessionsCase:
    started = time.monotonic()
    batches = with_event_time(generate(shape), step_ms(shape.events_per_batch))
    files = write_files(batches, directory / "data", columns=list(batches[0].frame.columns))
    permille = sample_permille(shape.users, sample)
    checksums, due = expected_checksums(batches)
    states = expected_state(batches, permille)
    case = SessionsCase(shape, batches, files, checksums, permille, states[TIMERS],
                        median(b.users for b in batches if b.kind == MEASURED), directory,
                        states=states, due_timers=due)
    measured_due = [due[i] for i in case.ids(MEASURED)]
    print(f"  workload: {len(batches)} batches of {shape.events_per_batch:,} clicks, "
          f"{case.touched:,.0f} users per measured batch, {median(measured_due):,.0f} "
          f"sessions closed by timers per measured batch; state compared on "
          f"{len(case.state):,} users; prepared in {time.monotonic() - started:.1f} s",
          flush=True)
    return case


def reused_sides(path: Path | None, case: SessionsCase, running: set[str]
                 ) -> dict[str, dict[str, Any]]:
    """The sides of the same case in an earlier results file (``--reuse``) that this run
    does not run again (the workload is the same: a fixed seed)."""
    if path is None:
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    machine = data.get("machine", {})
    found = {}
    for earlier in data["cases"]:
        if earlier["label"] != case.shape.label() or \
                earlier["events_per_batch"] != case.shape.events_per_batch or \
                earlier["measured"] != case.shape.measured:
            continue
        for name, side in earlier["sides"].items():
            if name not in running:
                found[name] = {**side, "reused_from": {
                    "file": path.name, "git_commit": machine.get("git_commit"),
                    "date_utc": machine.get("date_utc")}}
    return found


def runs(names: list[str], pinned: str, newest: tuple[str, str] | None) -> list[Run]:
    found = []
    for name in names:
        side = SIDES[name]
        found.append(Run(name, side, sys.executable, pinned))
        if side.role == SPARK and newest is not None and newest[1] != pinned:
            found.append(Run(f"{name}@{newest[1]}", side, newest[0], newest[1]))
    return found


def timer_figures(case: SessionsCase, side: dict[str, Any], raw: dict[str, Any]) -> None:
    """Timers fired per measured batch (ours: from its batch reports) and late rows."""
    reports = {r["batch_id"]: r for r in [*raw["run"]["reports"], *raw["restart"]["reports"]]}
    fired = [reports[i].get("timers_fired", 0) for i in case.ids(MEASURED) if i in reports]
    side["timers_fired_median"] = median(fired) if fired else None
    side["late_rows"] = sum(r.get("late_rows", 0) for r in reports.values())
    side["expected_due_timers_median"] = median(case.due_timers[i]
                                                for i in case.ids(MEASURED))


def costs(case: SessionsCase) -> dict[str, dict[str, float | None]]:
    """Per API of ours: TTL bookkeeping (median with TTL - without) and timers per due
    timer ((median with timers - without) / timers fired per batch)."""
    found: dict[str, dict[str, float | None]] = {}
    for prefix in ("ours", "ours_vectorized"):
        full, no_ttl, plain = (case.sides.get(f"{prefix}{s}", {})
                               for s in ("", "_no_ttl", "_plain"))
        if "median_ms" not in no_ttl:
            continue
        fired = no_ttl.get("timers_fired_median") or case.sides.get(prefix, {}).get(
            "timers_fired_median")
        found[prefix] = {
            "ttl_ms": (full["median_ms"] - no_ttl["median_ms"]) if "median_ms" in full
            else None,
            "timers_ms": (no_ttl["median_ms"] - plain["median_ms"]) if "median_ms" in plain
            else None,
            "timers_fired_per_batch": fired,
        }
        timers_ms = found[prefix]["timers_ms"]
        found[prefix]["per_due_timer_us"] = (timers_ms * 1000 / fired
                                             if timers_ms is not None and fired else None)
    return found


def case_targets(case: SessionsCase) -> list[dict[str, Any]]:
    """Per side of ours with timers and TTL: its median, and its first batch after
    kill -9, against the faster Spark operator's (each the faster at that figure)."""
    label = case.shape.label()
    spark = [s for s in case.sides.values() if s["role"] == SPARK and "median_ms" in s]
    if not spark:
        return []
    fastest = min(spark, key=lambda s: s["median_ms"])
    restarted = [s for s in spark if s.get("restart_first_ms") is not None]
    fastest_restart = min(restarted, key=lambda s: s["restart_first_ms"], default=None)
    found = []
    for name, side in case.sides.items():
        if name not in ("ours", "ours_vectorized") or "median_ms" not in side:
            continue
        found.append(_target(
            label, name, f"median <= {FASTER_SPARK_MAX}x the faster Spark operator's "
            f"({fastest['run']})", side["median_ms"] / fastest["median_ms"],
            FASTER_SPARK_MAX, side["ok"] and fastest["ok"]))
        if fastest_restart is not None and side.get("restart_first_ms") is not None:
            found.append(_target(
                label, name, f"first batch after kill -9 <= {RESTART_MAX}x the faster Spark "
                f"operator's ({fastest_restart['run']})",
                side["restart_first_ms"] / fastest_restart["restart_first_ms"], RESTART_MAX,
                side["ok"] and fastest_restart["ok"]))
    return found


def _signed_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0f} ms"


def case_table(case: SessionsCase) -> str:
    spark = [s["median_ms"] for s in case.sides.values()
             if s.get("role") == SPARK and "median_ms" in s]
    fastest = min(spark, default=None)
    rows, notes = [], []
    for name, side in case.sides.items():
        if "median_ms" not in side:
            notes.append(f"{name}: {side.get('skipped') or 'FAILED: ' + side.get('error', '?')}")
            continue
        rows.append([name, side["spark"], _ms(side["median_ms"]), _ms(side["p90_ms"]),
                     "-" if fastest is None else ratio_text(side["median_ms"] / fastest),
                     _ms(side["restart_first_ms"]),
                     "-" if side.get("timers_fired_median") is None
                     else f"{side['timers_fired_median']:,.0f}",
                     "ok" if side["ok"] else "WRONG"])
        if side.get("reused_from"):
            notes.append(f"{name}: from {side['reused_from']['file']} "
                         f"({side['reused_from']['git_commit']})")
    head = ["side", "PySpark", "median", "p90", "vs faster Spark", "restart 1st",
            "timers fired/batch", "checks"]
    lines = [table(head, rows), *notes]
    for prefix, cost in costs(case).items():
        ttl, timers, per = cost["ttl_ms"], cost["timers_ms"], cost["per_due_timer_us"]
        lines.append(f"  {prefix}: TTL bookkeeping {_signed_ms(ttl)} per batch; timers "
                     f"{_signed_ms(timers)} per batch, "
                     f"{'-' if per is None else f'{per:.1f} us'} per due timer "
                     f"({cost['timers_fired_per_batch'] or 0:,.0f} fired per batch)")
    return "\n".join(lines)


def states_equal(case: SessionsCase, raws: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Per kind of outputs, whether every side's final state of the sample was the same."""
    found = {}
    for outputs in case.states:
        states = [raw["restart"].get("state") for name, raw in raws.items()
                  if SIDES[name.split("@")[0]].outputs == outputs
                  and raw["restart"].get("state") is not None]
        if len(states) >= 2:
            found[outputs] = all(s == states[0] for s in states[1:])
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    names = args.sides.split(",") if args.sides else list(SIDES)
    unknown = [n for n in names if n not in SIDES]
    if unknown:
        raise SystemExit(f"--sides: unknown {unknown}; known: {list(SIDES)}")
    from spark_integration.sessions.session import spark_version

    pinned = spark_version()
    newest_version = spark_version_of(args.newest_python) if args.newest_python else None
    newest = (args.newest_python, newest_version) if newest_version else None
    if args.newest_python and newest is None:
        print(f"no PySpark in {args.newest_python}: run benchmarks/spark_newest_venv.sh; "
              "Spark's sides run on the pinned release only", flush=True)
    events = int(scaled(EVENTS_PER_BATCH, minimum=MIN_EVENTS_PER_BATCH))
    shapes = [WorkloadShape(users, events, args.warmup, args.batches,
                            active or max(1, int(users * ACTIVE_SHARE)), prefill_batches=2)
              for users, active in parse_cases(args.users)]
    extra = {"input_schema": INPUT_SCHEMA, "source_select": SOURCE_SELECT,
             "checksum_sql": list(CHECKSUM_SQL), "session_config": SESSION_CONFIG}
    plan = runs(names, pinned, newest)
    scratch = Path(tempfile.mkdtemp(prefix="bench-sessions-", dir=args.scratch))
    prepared: list[SessionsCase] = []
    failed = False
    started = time.monotonic()
    try:
        need_broker = any(r.side.role == OURS for r in plan)
        with kafka_broker() if need_broker else contextlib.nullcontext() as broker:
            for number, shape in enumerate(shapes):
                print(f"\n[sessions] {shape.label()}", flush=True)
                case = prepare(shape, scratch / f"case-{number}", args.state_sample)
                prepared.append(case)
                case.sides.update(reused_sides(args.reuse, case, {r.name for r in plan}))
                raws: dict[str, dict[str, Any]] = {}
                for item in plan:
                    side = item.side
                    why = side.unavailable()
                    if why is not None:
                        case.sides[item.name] = {"role": side.role, "skipped": why}
                        continue
                    print(f"  {item.name} (PySpark {item.spark})", flush=True)
                    module = ("benchmarks.sessions_ours_sides" if side.role == OURS
                              else "benchmarks.sessions_spark_sides")
                    spec = {**extra, "sides_module": module,
                            "plain_session": side.role != OURS}
                    try:
                        raws[item.name] = run_side(case, side, broker, args, None,
                                                   item.python, spec, item.name)
                    except Exception as exc:
                        failed = True
                        case.sides[item.name] = {"role": side.role, "error": str(exc)}
                        print(f"  !! {item.name} failed: {exc}", flush=True)
                        continue
                    result = analyse_side(case, side, raws[item.name])
                    result.update({"run": item.name, "side": side.name, "spark": item.spark})
                    timer_figures(case, result, raws[item.name])
                    if result["late_rows"]:
                        result["problems"].append(f"{result['late_rows']} late rows")
                        result["ok"] = False
                    case.sides[item.name] = result
                    failed = failed or not result["ok"]
                    print(f"    median {_ms(result.get('median_ms'))}, p90 "
                          f"{_ms(result.get('p90_ms'))}, first batch after restart "
                          f"{_ms(result['restart_first_ms'])}, checks "
                          f"{'ok' if result['ok'] else result['problems']}", flush=True)
                case.equal = states_equal(case, raws)
                failed = failed or not all(case.equal.values())
    finally:
        if args.keep_scratch:
            print(f"scratch kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return {
        "name": "sessions",
        "spark": pinned,
        "spark_versions": {"pinned": pinned, "newest": newest[1] if newest else None},
        "events_per_batch": events,
        "active_share": ACTIVE_SHARE,
        "sides": [r.name for r in plan],
        "cases": [{
            **c.summary(),
            "due_timers": c.due_timers,
            "states_equal_across_sides": c.equal,
            "costs": costs(c), "table": case_table(c), "sides": c.sides,
        } for c in prepared],
        "targets": [t for c in prepared for t in case_targets(c)],
        "failed": failed,
        "total_wall_s": round(time.monotonic() - started, 1),
    }


def report(results: dict[str, Any]) -> str:
    lines = [f"PySpark: pinned {results['spark_versions']['pinned']}, newest "
             f"{results['spark_versions']['newest'] or '(not run)'}"]
    for case in results["cases"]:
        lines.append(f"\n{case['label']}: {case['events_per_batch']:,} clicks per batch, "
                     f"{case['users_per_measured_batch']:,.0f} users per measured batch, "
                     f"{case['measured']} measured after {case['warmup']} warm-up")
        lines.append(case["table"])
        lines.extend(side_lines(case["sides"]))
        for outputs, equal in case["states_equal_across_sides"].items():
            lines.append(f"  final state ({outputs}) of {case['state_users']:,} sampled "
                         f"users equal across sides: {'yes' if equal else 'NO'}")
    lines.extend(target_lines(results["targets"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default=DEFAULT_USERS,
                        help="cases: USERS or USERS:ACTIVE (each batch drawn from ACTIVE "
                             f"random users; default half), comma-separated "
                             f"(default {DEFAULT_USERS})")
    parser.add_argument("--sides", default="",
                        help=f"comma-separated sides (default all: {','.join(SIDES)})")
    parser.add_argument("--batches", type=int, default=6, help="measured batches")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up batches")
    parser.add_argument("--newest-python", default=str(NEWEST_PYTHON) if NEWEST_PYTHON.exists()
                        else "", help="interpreter with the newest PySpark for Spark's sides "
                        "('' : pinned only)")
    parser.add_argument("--state-sample", type=int, default=2_000,
                        help="about this many users' final state is compared")
    parser.add_argument("--reuse", type=Path, default=None,
                        help="take the sides this run does not run from an earlier results "
                             "file of the same cases (e.g. to measure some sides again)")
    add_run_options(parser, 3600)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    if args.batches < 2 or args.warmup < 0:
        raise SystemExit("--batches must be >= 2 and --warmup >= 0")
    return finish(args, run(args), report)


if __name__ == "__main__":
    sys.exit(main())
