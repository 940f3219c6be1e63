"""Input for a file-source streaming query: one JSON-lines file per micro-batch, in order."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def write_batches(directory: Path, chunks: list[list[dict[str, Any]]]) -> None:
    """``chunks[i]`` as file ``part-{i:03d}.json``: with ``maxFilesPerTrigger=1``, batch
    ``i`` of a query reading ``directory``.

    Spark's file source takes the oldest file first; files written within one tick of
    the file system's clock would come in any order, so each gets a modification time
    one second after the one before.
    """
    directory.mkdir(parents=True, exist_ok=True)
    start = time.time() - len(chunks)
    for number, chunk in enumerate(chunks):
        path = directory / f"part-{number:03d}.json"
        path.write_text("".join(json.dumps(row) + "\n" for row in chunk))
        os.utime(path, (start + number, start + number))
