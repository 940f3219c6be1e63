"""StateOp codec: the hand-written Avro ``to_bytes``/``from_bytes`` against fastavro.

Every keyed state mutation encodes one ``StateOp`` (``schemas/state_op.avsc``) and
every change replayed on restore decodes one, so the codec is on the hot path of
both. No broker: this is CPU only.

Method. For each case (an op as an application writes it) both codecs run in this
process on the same op:

- ours: ``StateOp.to_bytes(op)`` and ``StateOp.from_bytes(data)``;
- baseline: what these did before, with fastavro through
  ``kafka_changelog.serialization``: ``encode("state_op", record)`` from the op's
  fields as a dict, and ``decode("state_op", data)`` back into a ``StateOp``
  (:func:`fastavro_to_bytes`, :func:`fastavro_from_bytes`).

Before timing, both must give the same bytes and the same op. Each measurement is
``timeit`` (garbage collector off) of N calls, N chosen per case for about 0.1 s
(times ``BENCH_SCALE``); ``--rounds`` rounds (default 9) alternate baseline/ours,
ours/baseline, ... and the fastest round of each side counts. Figures are ops/s and
µs per op; the ratio is ours / fastavro ops/s (higher is better). "Others' CPU" is
the share of the machine used by other processes while a case ran: on a shared
2-core machine, the figure that says how far to trust the rest.

Run: ``python -m benchmarks.bench_state_ops [--json FILE] [--rounds N]`` (default
``benchmarks/results/state_ops.json``).
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    ForeignLoad,
    machine_info,
    ratio_text,
    scale,
    table,
    wait_for_quiet,
    write_json,
)
from kafka_changelog.serialization import decode, encode
from kafka_changelog.state.schema.ops import OpKind, StateOp

DEFAULT_JSON = RESULTS_DIR / "state_ops.json"
#: Wall time each measurement aims at (at BENCH_SCALE=1).
TARGET_S = 0.1

KEY = b"user-042"  # 8 bytes, as a typical key


@dataclass(frozen=True)
class Case:
    """One op to encode and decode."""

    name: str
    description: str
    op: StateOp


CASES = (
    Case("set", 'SET of "count": 8-byte key, 8-byte value',
         StateOp("count", OpKind.SET, KEY, value=(7).to_bytes(8, "big"))),
    Case("list_replace_5", 'LIST_REPLACE of "events": 8-byte key, 5 values of 7-8 bytes',
         StateOp("events", OpKind.LIST_REPLACE, KEY,
                 values=tuple(f"click-{i}".encode() for i in range(5)))),
    Case("map_put", 'MAP_PUT of "pages": 8-byte key, 4-byte map key, 8-byte value',
         StateOp("pages", OpKind.MAP_PUT, KEY, b"home", (3).to_bytes(8, "big"))),
    Case("set_1kib", 'SET of "profile": 8-byte key, 1-KiB value',
         StateOp("profile", OpKind.SET, KEY, value=bytes(range(256)) * 4)),
)


def fastavro_to_bytes(op: StateOp) -> bytes:
    """The baseline encoder: fastavro with the schema file (the codec before)."""
    return encode("state_op", {
        "state": op.state, "op": op.op.value, "key": op.key,
        "map_key": op.map_key, "value": op.value,
        "values": list(op.values) if op.values is not None else None,
    })


def fastavro_from_bytes(data: bytes) -> StateOp:
    """The baseline decoder: fastavro with the schema file (the codec before)."""
    r = decode("state_op", data)
    values = r["values"]
    return StateOp(r["state"], OpKind(r["op"]), r["key"], r["map_key"], r["value"],
                   tuple(values) if values is not None else None)


def _calls_for(function: Callable[[Any], Any], argument: Any) -> int:
    """How many calls take about :data:`TARGET_S` (times ``BENCH_SCALE``)."""
    timer = timeit.Timer("f(x)", globals={"f": function, "x": argument})
    calls, seconds = timer.autorange()
    return max(1_000, int(calls * TARGET_S * scale() / seconds))


def _best_seconds_per_call(sides: dict[str, tuple[Callable[[Any], Any], Any]],
                           rounds: int) -> dict[str, float]:
    """Alternating rounds of every side; the fastest round of each, in s per call."""
    calls = {name: _calls_for(*side) for name, side in sides.items()}
    timers = {name: timeit.Timer("f(x)", globals={"f": f, "x": x})
              for name, (f, x) in sides.items()}
    best = {name: float("inf") for name in sides}
    order = list(sides)
    for round_no in range(rounds):
        for name in order if round_no % 2 == 0 else reversed(order):
            best[name] = min(best[name], timers[name].timeit(calls[name]) / calls[name])
    return best


def run_case(case: Case, rounds: int) -> dict[str, Any]:
    """Check both codecs agree on ``case``, then time them."""
    op = case.op
    data = fastavro_to_bytes(op)
    if op.to_bytes() != data:
        raise RuntimeError(f"{case.name}: the hand-written encoding differs from fastavro's")
    if StateOp.from_bytes(data) != op or fastavro_from_bytes(data) != op:
        raise RuntimeError(f"{case.name}: an op does not decode back to itself")
    foreign = ForeignLoad()
    encode_s = _best_seconds_per_call(
        {"fastavro": (fastavro_to_bytes, op), "ours": (StateOp.to_bytes, op)}, rounds)
    decode_s = _best_seconds_per_call(
        {"fastavro": (fastavro_from_bytes, data), "ours": (StateOp.from_bytes, data)}, rounds)
    result: dict[str, Any] = {"name": case.name, "description": case.description,
                              "encoded_bytes": len(data)}
    for what, seconds in (("to_bytes", encode_s), ("from_bytes", decode_s)):
        result[what] = {
            side: {"us_per_op": s * 1e6, "ops_per_s": 1 / s} for side, s in seconds.items()
        }
        result[what]["ratio"] = seconds["fastavro"] / seconds["ours"]
    result["foreign_cpu_share"] = foreign.share()
    return result


def run(rounds: int = 9) -> dict[str, Any]:
    """Every case; the JSON-able results."""
    print(f"\n[state ops] {len(CASES)} cases, {rounds} alternating rounds each", flush=True)
    waited = wait_for_quiet(label="[state ops] ")
    cases = []
    for case in CASES:
        result = run_case(case, rounds)
        cases.append(result)
        print(f"  {case.name:<15} to_bytes {ratio_text(result['to_bytes']['ratio'])}, "
              f"from_bytes {ratio_text(result['from_bytes']['ratio'])} "
              f"(others used {result['foreign_cpu_share']:.0%} of the CPUs)", flush=True)
    return {"name": "state_ops", "rounds": rounds, "quiet_wait": waited, "cases": cases}


def report(results: dict[str, Any]) -> str:
    """The results as a table: ops/s and µs per op of each side, and the ratio."""
    rows = []
    for case in results["cases"]:
        for what in ("to_bytes", "from_bytes"):
            found = case[what]
            rows.append([
                f"{case['name']} {what}",
                f"{found['ours']['ops_per_s']:,.0f}", f"{found['ours']['us_per_op']:.2f}",
                f"{found['fastavro']['ops_per_s']:,.0f}",
                f"{found['fastavro']['us_per_op']:.2f}",
                ratio_text(found["ratio"]), f"{case['foreign_cpu_share']:.0%}",
            ])
    return table(["case", "ours ops/s", "ours µs", "fastavro ops/s", "fastavro µs",
                  "ratio", "others' CPU"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="write the results to this file")
    parser.add_argument("--rounds", type=int, default=9,
                        help="alternating measured rounds of each codec")
    args = parser.parse_args(argv)
    results = run(rounds=args.rounds)
    machine = machine_info()
    for unused in ("kafka", "broker", "confluent_kafka", "librdkafka"):  # no broker here
        machine.pop(unused, None)
    results["machine"] = machine
    print("\nStateOp codec (best round of each side; ratio = ours / fastavro ops/s)")
    for case in CASES:
        print(f"  {case.name}: {case.description}")
    print(report(results))
    write_json(args.json, results)
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
