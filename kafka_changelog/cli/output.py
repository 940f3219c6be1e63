"""How commands print: aligned tables for people, JSON for scripts, progress on stderr."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows under headers, columns padded to their widest cell (no trailing blanks)."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row]
                                           for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             .rstrip() for row in cells]
    return "\n".join(lines)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout."""
    print(json.dumps(data, indent=2, sort_keys=False))


def progress(message: str) -> None:
    """A progress line on stderr (stdout stays clean for tables and JSON)."""
    print(f"kafka-changelog: {message}", file=sys.stderr, flush=True)


def outcome(as_json: bool, record: dict[str, Any], print_text: Callable[[], None],
            refusal: str | None) -> int:
    """Print a writing command's outcome (``record`` as JSON, else ``print_text()``) and
    its refusal on stderr; the exit code: 1 refused (a dry run included), else 0."""
    if as_json:
        print_json({**record, "refused": refusal})
    else:
        print_text()
    if refusal is not None:
        progress(refusal)
        return 1
    return 0


def now_ms() -> int:
    """The current time in epoch milliseconds."""
    return int(time.time() * 1000)


def when(timestamp_ms: int) -> str:
    """A UTC time of epoch milliseconds: ``2025-06-01T12:00:03Z``."""
    moment = dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def age(timestamp_ms: int, now: int | None = None) -> str:
    """How long ago: ``42s``, ``5m03s``, ``2h10m``, ``3d04h`` (``in the future`` if so)."""
    seconds = ((now if now is not None else now_ms()) - timestamp_ms) // 1000
    if seconds < 0:
        return "in the future"
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def size(count: int) -> str:
    """Bytes for people: ``812 B``, ``12.3 KiB``, ``4.0 MiB``, ``1.2 GiB``."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")
