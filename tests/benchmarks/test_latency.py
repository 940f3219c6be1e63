"""The latency benchmark's measure: which records an output reflects, and when (pure)."""

from __future__ import annotations

from benchmarks.bench_latency import SideRun


def test_an_output_gives_each_record_it_newly_counts_its_latency() -> None:
    run = SideRun(sent={"a": [100.0, 200.0, 300.0], "b": [150.0]})
    run.received("a", 2, 1000.0, measured_from_ms=0.0)  # records 1 and 2 of a
    assert run.latencies_ms == [900.0, 800.0]
    run.received("b", 1, 1100.0, measured_from_ms=0.0)
    run.received("a", 3, 1200.0, measured_from_ms=0.0)
    assert run.latencies_ms == [900.0, 800.0, 950.0, 900.0]
    assert run.complete() and run.outputs == 3 and run.repeated == 0


def test_repeats_count_nothing_twice_and_the_warm_up_is_left_out() -> None:
    run = SideRun(sent={"a": [100.0, 200.0, 300.0]})
    run.received("a", 2, 1000.0, measured_from_ms=150.0)  # record 1 sent in the warm-up
    run.received("a", 2, 1500.0, measured_from_ms=150.0)  # the same output again
    assert run.latencies_ms == [800.0]
    assert (run.outputs, run.repeated, run.complete()) == (2, 1, False)
    run.received("a", 3, 1600.0, measured_from_ms=150.0)
    assert run.latencies_ms == [800.0, 1300.0] and run.complete()
