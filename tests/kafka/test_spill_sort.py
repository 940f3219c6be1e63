"""SpillingSorter: the order of ``sorted()`` with runs spilled to disk, and its bound."""

from __future__ import annotations

import os
import random
from pathlib import Path

from kafka_changelog.kafka.spill_sort import ENTRY_OVERHEAD, Entry, SpillingSorter


def entries(count: int, seed: int = 3) -> list[Entry]:
    rng = random.Random(seed)
    made = [(rng.randrange(50), rng.randrange(100), rng.randrange(8), rng.randbytes(20))
            for _ in range(count)]
    return made + made[: count // 10]  # copies, as retried uploads leave


def test_spilled_runs_merge_to_the_in_memory_order(tmp_path: Path) -> None:
    data = entries(5_000)
    sorter = SpillingSorter(budget_bytes=20_000, directory=str(tmp_path))
    for i in range(0, len(data), 7):  # one "record" at a time
        batch = data[i:i + 7]
        sorter.extend(batch, sum(len(e[3]) for e in batch))
    assert sorter.spilled_runs > 10
    assert os.listdir(tmp_path) == []  # unnamed temporary files
    assert list(sorter.sorted()) == sorted(data)
    assert sorter.peak_held_bytes <= 20_000 + 7 * (20 + ENTRY_OVERHEAD)


def test_below_the_budget_nothing_spills() -> None:
    data = entries(100)
    sorter = SpillingSorter(budget_bytes=10 ** 9)
    sorter.extend(data, 0)
    assert list(sorter.sorted()) == sorted(data)
    assert sorter.spilled_runs == 0


def test_close_without_iterating_drops_the_runs() -> None:
    sorter = SpillingSorter(budget_bytes=1_000)
    sorter.extend(entries(500), 10_000)
    assert sorter.spilled_runs == 1
    sorter.close()
    assert sorter.spilled_runs == 0
