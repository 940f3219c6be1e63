"""The suite's scheduling hints stay true to the modules (see tests/conftest.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import CLUSTER_FIXTURES, CLUSTER_MODULES

ROOT = Path(__file__).resolve().parents[1]
USES_A_CLUSTER = re.compile(r"\b(" + "|".join(sorted(CLUSTER_FIXTURES)) + r")\b")


def test_the_cluster_modules_are_exactly_those_using_the_shared_clusters() -> None:
    # A module left out would start the clusters again on the other worker; one listed
    # without using them would only lengthen the cluster unit.
    using = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").rglob("test_*.py")
             if USES_A_CLUSTER.search(path.read_text(encoding="utf-8"))}
    assert using == CLUSTER_MODULES
