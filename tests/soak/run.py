"""The soak as a command: ``python -m tests.soak.run --seed N --batches 500 --faults 50``.

Starts three local brokers and a Spark standalone cluster (loopback only), runs each
seed (``--seed`` repeatable, or ``--seeds K`` seeds from ``--seed``), prints a failing
seed with the command that reruns it, and writes the results as JSON (``--output``).
Exit code 0 when every seed passed.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from tests.spark.standalone import LocalSparkCluster

from . import checks
from .harness import BROKER_OVERRIDES, Soak, SoakResult, SoakSettings


@contextmanager
def spark_session() -> Iterator[Any]:
    """A ``local[2]`` session on loopback, for reading the outputs with Spark's
    connector."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from spark_integration.sessions.session import local_session

    session = local_session(app_name="soak-check", parallelism=2, extra_config={
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    try:
        yield session
    finally:
        session.stop()


def report(result: SoakResult) -> str:
    """One seed's outcome in a line (with the rerun command when it failed)."""
    kinds = sorted({f.kind.value for f in result.injected})
    line = (f"seed {result.settings.seed} ({', '.join(result.variants)}): "
            f"{'PASS' if result.passed else 'FAIL'}, {result.batches} batches, "
            f"{len(result.injected)} faults {kinds}, {result.seconds:.0f} s")
    if not result.passed:
        line += f"\n  problems: {result.problems}\n  rerun: {result.settings.command()}"
    return line


def main(argv: list[str] | None = None) -> int:
    """Run the soak's seeds; write the JSON result."""
    parser = argparse.ArgumentParser(description="the seeded chaos soak")
    parser.add_argument("--seed", type=int, action="append", default=None)
    parser.add_argument("--seeds", type=int, default=1,
                        help="with one --seed: run this many seeds from it")
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--per-batch", type=int, default=20)
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--measure-at", type=int, default=50)
    parser.add_argument("--output", type=Path, default=None,
                        help="where to write the JSON result (default: print it)")
    parser.add_argument("--until", default=None, metavar="YYYY-MM-DDTHH:MM",
                        help="a UTC deadline: inject no more faults then and end the seed "
                             "(its checks and last figures) as if it had run its batches")
    parser.add_argument("--no-spark-check", action="store_true",
                        help="skip reading the outputs with Spark's connector")
    args = parser.parse_args(argv)
    deadline = (calendar.timegm(time.strptime(args.until, "%Y-%m-%dT%H:%M"))
                if args.until else None)
    seeds = args.seed or [1]
    if len(seeds) == 1 and args.seeds > 1:
        seeds = list(range(seeds[0], seeds[0] + args.seeds))
    results: list[dict[str, Any]] = []
    started = time.time()

    def write(seeds_now: list[dict[str, Any]], finished: bool) -> None:
        document = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                    "seconds": round(time.time() - started), "finished": finished,
                    "passed": all(r["passed"] for r in seeds_now), "seeds": seeds_now}
        text = json.dumps(document, indent=2)
        if args.output is None:
            if finished:
                print(text)
        else:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(text + "\n")

    with (LocalKafkaCluster(nodes=3, broker_overrides=BROKER_OVERRIDES) as kafka,
          LocalSparkCluster(workers=2, cores_per_worker=1) as spark,
          tempfile.TemporaryDirectory(prefix="soak-") as workdir):
        for seed in seeds:
            settings = SoakSettings(seed, args.batches, args.faults, args.per_batch,
                                    args.users, args.measure_at, deadline=deadline)
            soak = Soak(settings, kafka, spark, Path(workdir) / str(seed),
                        lambda partial: write([*results, partial.to_json()], False))
            result = soak.run()
            if result.passed and not args.no_spark_check:
                with spark_session() as session:
                    result.problems += checks.spark_problems(session, soak.config,
                                                             soak.job.output_topic)
            print(report(result), flush=True)
            results.append(result.to_json())
    write(results, True)
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
