"""The Python examples in the docs run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


#: The documents whose examples run here (one per line).
IN_PROCESS_DOCS = [
    "state.md",
    "spark.md",
    "schema-evolution.md",
    "rewind.md",
    "fork.md",
]


@pytest.mark.parametrize("doc", IN_PROCESS_DOCS)
def test_examples_run(doc: str) -> None:
    blocks = python_blocks(DOCS / doc)
    assert blocks, f"no python example in {doc}"
    for block in blocks:
        exec(compile(block, f"{doc} example", "exec"), {"__name__": "docs_example"})
