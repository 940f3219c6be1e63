"""Moved to :mod:`kafka_changelog.kafka.transactional_commit` in 0.2 (deprecated alias)."""

from __future__ import annotations

from typing import Any

_MOVED = frozenset({"OutputRecord", "TransactionAbortedError", "TransactionFencedError",
                    "TransactionalCommitter"})


def __getattr__(name: str) -> Any:
    """The moved names, still importable from here (deprecated)."""
    if name in _MOVED:
        import warnings

        from ..kafka import transactional_commit as moved  # deprecated alias: see _MOVED

        warnings.warn(f"{__name__}.{name} moved to kafka_changelog.kafka.transactional_commit",
                      DeprecationWarning, stacklevel=2)
        return getattr(moved, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
