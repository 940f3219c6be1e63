"""The clickstream: deterministic click events of users, for the jobs and the demos."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

KINDS = ("view", "click", "purchase")
KIND_WEIGHTS = (70, 25, 5)
PAGES = ("home", "search", "item", "cart", "help")


def events(count: int, users: int, seed: int = 7) -> Iterator[dict[str, Any]]:
    """``count`` events of ``users`` users, the same for the same seed: ``seq`` (0 on),
    ``user`` (``user-0042``), ``kind`` (view, click or purchase), ``page`` and ``amount``
    (whole cents from 1 to 100 for a purchase, else 0.0)."""
    rng = random.Random(seed)
    for seq in range(count):
        kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
        yield {
            "seq": seq,
            "user": f"user-{rng.randrange(users):04d}",
            "kind": kind,
            "page": rng.choice(PAGES),
            "amount": round(rng.uniform(1, 100), 2) if kind == "purchase" else 0.0,
        }
