"""Filter pushdown of ``format("kafka-changelog")``: filters on keys read only their key groups.

Spark hands the reader the filters of a query (``DataSourceReader.pushFilters``, PySpark
4.1+). Those on ``key`` (``=``, ``IN``; binary), ``key_decoded`` (``=``, ``IN``; text, with
the key column types the checkpoint records) and ``key_group`` (``=``, ``IN``, ``<``,
``<=``, ``>``, ``>=``) tell which key groups can hold matching rows: a key's key group is
what the writers compute (:func:`~kafka_changelog.keygroups.key_group_for_key` with the
checkpoint's max parallelism). The plan then reads only those key groups: in mode
``state`` their snapshot chunks and the changelog partitions holding them, in mode
``changes`` and between checkpoints the offset slices of those partitions.

Pushdown is off unless the reader option ``pushdown`` is ``true``: PySpark 4.2.0 keeps the
plan a filtered scan made on the DataFrame's relation and reuses it for a later scan of the
same DataFrame without filters (fixed in later Spark versions), which would then read only
the filtered key groups. A lookup DataFrame of its own (its own ``load()``) is safe.

Pushing only narrows what is read: every filter is still handed back to Spark, which
applies it to the rows (so a registration row, ``key_group`` null, or a key sharing the
key group never leaks through). A filter the reader cannot use (another column, another
comparison, a ``key_decoded`` text no recorded key type encodes) narrows nothing.
PySpark 4.0 has no filter pushdown for Python data sources: there the option reads every
key group, with a warning (:data:`~spark_integration.sessions.spark_versions.SparkFeature`).
No pyspark import at module level (the filter classes are 4.1's).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka_changelog.keygroups import key_group_for_key
from kafka_changelog.keys import encode_key, key_text

from ..sessions.spark_versions import SparkFeature, missing, supports
from .planning import ReaderOptionError

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter

logger = logging.getLogger(__name__)

#: The reader option that turns pushdown on (off by default: PySpark 4.2.0 reuses the plan
#: of a filtered scan for later scans of the same DataFrame without filters).
PUSHDOWN_OPTION = "pushdown"

KEY = ("key",)
KEY_DECODED = ("key_decoded",)
KEY_GROUP = ("key_group",)


@dataclass(frozen=True)
class KeySelection:
    """What the pushed filters allow (ANDed): each field None when unconstrained."""

    #: Keys (bytes) the rows must have.
    keys: frozenset[bytes] | None = None
    #: ``key_decoded`` texts the rows must have.
    key_texts: frozenset[str] | None = None
    #: Key groups the rows must be in.
    key_groups: frozenset[int] | None = None
    #: ``key_group`` bounds (inclusive; None: unbounded).
    lowest: int | None = None
    highest: int | None = None

    @property
    def is_empty(self) -> bool:
        """True when no filter constrains the key groups."""
        return (self.keys is None and self.key_texts is None and self.key_groups is None
                and self.lowest is None and self.highest is None)

    def groups(self, max_parallelism: int, key_types: Sequence[str] | None
               ) -> frozenset[int] | None:
        """The key groups that can hold matching rows (None: all)."""
        if self.is_empty:
            return None
        allowed = set(range(max_parallelism))
        if self.keys is not None:
            allowed &= {key_group_for_key(k, max_parallelism) for k in self.keys}
        if self.key_texts is not None:
            encoded = [key_bytes_of_text(t, key_types) for t in self.key_texts]
            if all(e is not None for e in encoded):
                allowed &= {key_group_for_key(e, max_parallelism)
                            for e in encoded if e is not None}
        if self.key_groups is not None:
            allowed &= self.key_groups
        if self.lowest is not None:
            allowed = {g for g in allowed if g >= self.lowest}
        if self.highest is not None:
            allowed = {g for g in allowed if g <= self.highest}
        return frozenset(allowed)


def key_bytes_of_text(text: str, key_types: Sequence[str] | None) -> bytes | None:
    """The key whose ``key_decoded`` is ``text`` under ``key_types``, or None when none
    is found (no types recorded, a text they do not encode)."""
    if key_types is None:
        return None
    candidates: list[list[Any]] = []
    if len(key_types) == 1:
        candidates.append([text])
        with contextlib.suppress(ValueError):
            candidates.append([int(text)])
    else:
        try:
            parsed = json.loads(text)
        except ValueError:
            return None
        if isinstance(parsed, list):
            candidates.append(parsed)
    for values in candidates:
        try:
            key = encode_key(values, key_types)
        except (ValueError, TypeError):
            continue
        if key_text(key, key_types) == text:
            return key
    return None


def _as_bytes(value: Any) -> bytes | None:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return None


def _one_of(values: Iterable[Any], convert: Any) -> frozenset[Any] | None:
    converted = [convert(v) for v in values]
    if any(c is None for c in converted):
        return None
    return frozenset(converted)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _and(current: frozenset[Any] | None, more: frozenset[Any]) -> frozenset[Any]:
    return more if current is None else current & more


def pushdown_enabled(options: Mapping[str, str]) -> bool:
    """Whether the options turn key pushdown on (option ``pushdown``: ``true``/``false``);
    raises :class:`~.planning.ReaderOptionError` naming the option for another value.
    On a PySpark without filter pushdown (4.0) the option reads every key group, with a
    warning that says so."""
    found = {str(k).lower(): str(v) for k, v in options.items()}.get(PUSHDOWN_OPTION, "false")
    value = found.strip().lower()
    if value not in ("true", "false"):
        raise ReaderOptionError(f"option pushdown must be true or false, got {found!r}")
    if value == "true" and not supports(SparkFeature.READER_FILTER_PUSHDOWN):
        logger.warning("format(%r) option pushdown=true: %s", "kafka-changelog",
                       missing(SparkFeature.READER_FILTER_PUSHDOWN))
        return False
    return value == "true"


def select(filters: Iterable[Filter]) -> KeySelection:
    """The selection the filters on ``key``, ``key_decoded`` and ``key_group`` make
    (PySpark 4.1+ hands them over: the filter classes are imported here)."""
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        LessThan,
        LessThanOrEqual,
    )

    keys: frozenset[bytes] | None = None
    texts: frozenset[str] | None = None
    groups: frozenset[int] | None = None
    lowest: int | None = None
    highest: int | None = None
    for f in filters:
        attribute = getattr(f, "attribute", None)
        values: tuple[Any, ...] | None = None
        if isinstance(f, EqualTo):
            values = (f.value,)
        elif isinstance(f, In):
            values = tuple(f.value)
        if values is not None:
            if attribute == KEY:
                found = _one_of(values, _as_bytes)
                if found is not None:
                    keys = _and(keys, found)
            elif attribute == KEY_DECODED:
                found = _one_of(values, _text)
                if found is not None:
                    texts = _and(texts, found)
            elif attribute == KEY_GROUP:
                found = _one_of(values, _int)
                if found is not None:
                    groups = _and(groups, found)
            continue
        if attribute != KEY_GROUP:
            continue
        bound = _int(getattr(f, "value", None))
        if bound is None:
            continue
        if isinstance(f, GreaterThan | GreaterThanOrEqual):
            low = bound + 1 if isinstance(f, GreaterThan) else bound
            lowest = low if lowest is None else max(lowest, low)
        elif isinstance(f, LessThan | LessThanOrEqual):
            high = bound - 1 if isinstance(f, LessThan) else bound
            highest = high if highest is None else min(highest, high)
    return KeySelection(keys, texts, groups, lowest, highest)


__all__ = [
    "KEY",
    "KEY_DECODED",
    "KEY_GROUP",
    "PUSHDOWN_OPTION",
    "KeySelection",
    "key_bytes_of_text",
    "pushdown_enabled",
    "select",
]
