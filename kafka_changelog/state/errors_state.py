"""Errors of the state layer that are not about snapshots or checkpoint storage."""

from __future__ import annotations

from ..errors import ChangelogError


class StateMismatchError(ChangelogError, ValueError):
    """A state was registered (or restored) with another kind or serializer."""


class NoCurrentKeyError(ChangelogError, RuntimeError):
    """Keyed state was used before ``set_current_key``."""


class MaterializationFailedError(ChangelogError):
    """Materialization failed more often in a row than allowed."""
