"""Which driver holds an application: the claim record and the rules for taking it over.

One driver at a time runs an application's batches. The one holding the newest
:class:`DriverClaim` (key ``{application}/driver`` of the checkpoint topic) is the
only one whose checkpoint commits and whose tasks' output commits succeed; a claim
carries an *epoch* that grows by one at every takeover, and every task transaction
carries the epoch of the driver that planned it, so a zombie's tasks refuse to commit
once a newer claim exists (see ``kafka/driver_lease.py``).

A new driver may take an application over when its holder is gone: it released the
claim (a clean stop), its heartbeat is older than the lease, it ran on this host in a
process that no longer exists, or it runs the same Spark query (a restart of a query
from its checkpointLocation: the newer driver is the one Spark runs). Otherwise the
holder is alive and running another query of the application, and a second driver
would process the input twice: it waits for the lease to expire, then gives up with
:class:`ApplicationHeldError`.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from ...serialization import decode, encode
from ..errors import CheckpointFormatError, CheckpointStoreError

DRIVER_CLAIM_SCHEMA = "driver_claim"
DRIVER_CLAIM_SCHEMA_HEADER = f"{DRIVER_CLAIM_SCHEMA}/1"
_DRIVER_SUFFIX = "/driver"

#: How long (seconds) a driver's claim holds without a heartbeat (see ``driver_lease_s``).
DEFAULT_DRIVER_LEASE_S = 60.0


def driver_claim_key(application: str) -> str:
    """Record key of an application's driver claim: ``{application}/driver``."""
    return f"{application}{_DRIVER_SUFFIX}"


def parse_driver_claim_key(key: str) -> str | None:
    """The application of a driver claim key; None for other keys."""
    return key[: -len(_DRIVER_SUFFIX)] if key.endswith(_DRIVER_SUFFIX) else None


class DriverFencedError(CheckpointStoreError):
    """A newer driver took the application over: this one may not commit anything more.

    Raised to a zombie driver (its checkpoint commit) and to its tasks (their output
    commits); nothing of the batch it was running becomes visible.
    """


class ApplicationHeldError(CheckpointStoreError):
    """Another live driver runs the application (another query): refused, so that the
    input is not processed twice."""


def _process_started(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot ("" if unknown): with the
    pid it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # Field 22 (starttime) comes after the command name, which may hold spaces.
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass(frozen=True)
class DriverIdentity:
    """One driver process: where it runs and an id unique to it."""

    driver_id: str
    host: str
    pid: int
    process_started: str

    @classmethod
    def of_this_process(cls) -> DriverIdentity:
        """This process (the id is fixed for the life of the process)."""
        return _THIS_PROCESS

    def is_gone(self) -> bool:
        """Whether this identity is a process of this host that no longer runs (False
        for another host's process: that cannot be told from here)."""
        if self.host != socket.gethostname():
            return False
        return _process_started(self.pid) != self.process_started


_THIS_PROCESS = DriverIdentity(uuid.uuid4().hex, socket.gethostname(), os.getpid(),
                               _process_started(os.getpid()))


class Takeover(Enum):
    """Whether a driver may take an application over from the claim found."""

    #: Nobody holds it (no claim, released, expired, or a process of this host that died).
    FREE = "free"
    #: This process holds it already.
    OWN = "own"
    #: Its holder runs the same Spark query: a restart of the query, the holder a zombie.
    SAME_QUERY = "same_query"
    #: A live driver of another query holds it.
    HELD = "held"


@dataclass(frozen=True)
class DriverHolder:
    """The driver a batch's tasks belong to, as they carry it (picklable, small)."""

    application: str
    epoch: int
    driver_id: str

    def holds(self, claim: DriverClaim) -> bool:
        """Whether ``claim`` is this driver's (any heartbeat of it)."""
        return claim.epoch == self.epoch and claim.driver.driver_id == self.driver_id

    def superseded_by(self, claim: DriverClaim) -> bool:
        """Whether ``claim`` was made after this driver's (older claims do not matter)."""
        return claim.epoch > self.epoch or (
            claim.epoch == self.epoch and claim.driver.driver_id != self.driver_id)


@dataclass(frozen=True)
class DriverClaim:
    """The holder of an application (see the module docstring).

    Invariant: ``epoch`` only grows across an application's claims; a claim with the
    same ``epoch`` and ``driver_id`` is a heartbeat of the same holder.
    """

    application: str
    epoch: int
    driver: DriverIdentity
    query_id: str
    claimed_ms: int
    heartbeat_ms: int
    released: bool = False

    def takeover(self, by: DriverIdentity, query_id: str, now_ms: int,
                 lease_s: float) -> Takeover:
        """Whether driver ``by`` running ``query_id`` may take over at ``now_ms``."""
        if self.driver.driver_id == by.driver_id:
            return Takeover.OWN
        if self.released or now_ms - self.heartbeat_ms > lease_s * 1000 or self.driver.is_gone():
            return Takeover.FREE
        if query_id and self.query_id == query_id:
            return Takeover.SAME_QUERY
        return Takeover.HELD

    def holder(self) -> DriverHolder:
        """What the tasks of this driver's batches carry."""
        return DriverHolder(self.application, self.epoch, self.driver.driver_id)

    def describe(self) -> str:
        """Who holds the claim, for error messages."""
        d = self.driver
        return (f"driver {d.driver_id[:8]} (host {d.host}, pid {d.pid}, Spark query "
                f"{self.query_id or '(none)'}, epoch {self.epoch}, last heartbeat at "
                f"{self.heartbeat_ms} ms since the epoch)")

    def to_bytes(self) -> bytes:
        """The Avro encoding (``schemas/driver_claim.avsc``)."""
        d = self.driver
        return encode(DRIVER_CLAIM_SCHEMA, {
            "application": self.application, "epoch": self.epoch, "driver_id": d.driver_id,
            "host": d.host, "pid": d.pid, "process_started": d.process_started,
            "query_id": self.query_id, "claimed_ms": self.claimed_ms,
            "heartbeat_ms": self.heartbeat_ms, "released": self.released})

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> DriverClaim:
        """Decode a claim; :class:`CheckpointFormatError` names ``where`` if it cannot."""
        try:
            r = decode(DRIVER_CLAIM_SCHEMA, data)
        except Exception as exc:
            raise CheckpointFormatError(f"cannot decode the driver claim at {where}: {exc}"
                                        ) from exc
        return cls(r["application"], int(r["epoch"]),
                   DriverIdentity(r["driver_id"], r["host"], int(r["pid"]),
                                  r["process_started"]),
                   r["query_id"], int(r["claimed_ms"]), int(r["heartbeat_ms"]),
                   bool(r["released"]))


__all__ = ["DEFAULT_DRIVER_LEASE_S", "DRIVER_CLAIM_SCHEMA_HEADER", "ApplicationHeldError",
           "DriverClaim", "DriverFencedError", "DriverHolder", "DriverIdentity", "Takeover",
           "driver_claim_key", "parse_driver_claim_key"]
