"""Enums whose members are their string values: to ``==``, hashing, ``str()``,
``format()`` and JSON, so that names users pass as strings (``state_backend="rocksdb"``,
a listener comparing ``event == "before_commit"``) and the values reports carry stay
plain strings, while the library's own code is checked against the members.

Python 3.11's ``enum.StrEnum`` does this; the library supports 3.10.
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A ``str`` enum that formats as its value (``f"{member}"`` is ``member.value``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return format(str(self.value), format_spec)


__all__ = ["StrEnum"]
