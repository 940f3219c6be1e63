"""Time to live of keyed state: how long an entry lives after it was written, and how an
expiry travels with the entry's bytes.

A state with a TTL stores each value (a value state's value, each list element, each map
entry's value) as its expiry time (milliseconds since the epoch, 8 bytes big-endian)
followed by the value's serialized bytes. The expiry is absolute, written when the entry
is written (and, with ``update_on_read``, when it is read): so the snapshot, the changelog,
a restore at any parallelism and the readers all see the same expiry, and an entry is
expired exactly when the time it is read at has reached it. The time is the processing
time the backend is given (in streaming: the batch's, fixed for the batch and recorded
with its checkpoint, so a re-run batch expires exactly what its first run did).

The state's registration records its value serializer as ``ttl:<serializer name>``, which
tells the readers how to take the expiry off. Changing a state's TTL duration between runs
applies from the next write of each entry; adding or removing a TTL changes how its bytes
are laid out and is refused at registration, naming the state.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import timedelta

from .kinds import Entry

#: A TTL'd entry's expiries, in its shape: one (value), per element (list), per map key.
Expiries = int | list[int] | dict[bytes, int]

#: The prefix of a TTL'd state's value serializer name.
TTL_SERIALIZER_PREFIX = "ttl:"
_EXPIRY = struct.Struct(">q")
#: Bytes of the expiry before each TTL'd value.
EXPIRY_BYTES = _EXPIRY.size
_pack_expiry = _EXPIRY.pack
_unpack_expiry = _EXPIRY.unpack_from


@dataclass(frozen=True)
class StateTtl:
    """How long a state's entries live.

    ``ttl_ms`` (> 0) after an entry's last write (and, with ``update_on_read``, its last
    read) the entry is expired: invisible to reads at once, and removed from the state
    (the removal is a logged change like any other).
    """

    ttl_ms: int
    update_on_read: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.ttl_ms, bool) or not isinstance(self.ttl_ms, int):
            raise TypeError(f"ttl_ms must be an int of milliseconds, got {self.ttl_ms!r}")
        if self.ttl_ms <= 0:
            raise ValueError(f"a state's TTL must be positive, got {self.ttl_ms} ms")

    @staticmethod
    def of(ttl: StateTtl | timedelta | float, state: str) -> StateTtl:
        """``ttl`` as a :class:`StateTtl`: a ``timedelta``, a number of seconds, or one
        already; a zero or negative duration raises ``ValueError`` naming ``state``."""
        if isinstance(ttl, StateTtl):
            return ttl
        if isinstance(ttl, timedelta):
            ms = round(ttl.total_seconds() * 1000)
        elif isinstance(ttl, (int, float)) and not isinstance(ttl, bool):
            ms = round(ttl * 1000)
        else:
            raise TypeError(f"state {state!r}: ttl must be a timedelta, a number of seconds "
                            f"or a StateTtl, got {type(ttl).__name__}")
        if ms <= 0:
            raise ValueError(f"state {state!r}: ttl must be positive, got {ttl!r}")
        return StateTtl(ms)


def ttl_serializer_name(value_serializer: str) -> str:
    """The registered value serializer name of a TTL'd state."""
    return TTL_SERIALIZER_PREFIX + value_serializer


def split_serializer_name(name: str) -> tuple[str, bool]:
    """(the values' own serializer name, whether each value carries an expiry)."""
    if name.startswith(TTL_SERIALIZER_PREFIX):
        return name[len(TTL_SERIALIZER_PREFIX):], True
    return name, False


def stamp(expires_at_ms: int, data: bytes) -> bytes:
    """``data`` with its expiry in front (what a TTL'd state stores)."""
    return _pack_expiry(expires_at_ms) + data


def expiry_of(stored: bytes) -> int:
    """The expiry (ms since the epoch) of a TTL'd state's stored value."""
    if len(stored) < EXPIRY_BYTES:
        raise ValueError(f"a TTL'd value needs {EXPIRY_BYTES} bytes of expiry, got "
                         f"{len(stored)} bytes")
    return int(_unpack_expiry(stored)[0])


def value_of(stored: bytes) -> bytes:
    """The value's own bytes (without its expiry)."""
    return stored[EXPIRY_BYTES:]


def live_entry(entry: Entry, at_ms: int | None) -> tuple[Entry | None, Expiries]:
    """A TTL'd state's entry as readers show it at ``at_ms`` (None: everything): its
    values without their expiries, the expired ones left out (None when nothing is left),
    and the expiries of what is left, in the entry's shape."""
    live = (lambda expires: True) if at_ms is None else (lambda expires: expires > at_ms)
    if isinstance(entry, bytes):
        expires = expiry_of(entry)
        return (value_of(entry) if live(expires) else None), expires
    if isinstance(entry, list):
        kept = [item for item in entry if live(expiry_of(item))]
        return ([value_of(i) for i in kept] or None), [expiry_of(i) for i in kept]
    kept_map = {k: v for k, v in entry.items() if live(expiry_of(v))}
    return ({k: value_of(v) for k, v in kept_map.items()} or None,
            {k: expiry_of(v) for k, v in kept_map.items()})


__all__ = ["EXPIRY_BYTES", "TTL_SERIALIZER_PREFIX", "Expiries",
           "StateTtl", "expiry_of", "live_entry", "split_serializer_name", "stamp",
           "ttl_serializer_name", "value_of"]
