"""Which snapshot chunks nothing will ever name again: the sweep's rules.

Garbage collection of checkpoints tombstones the chunks of the checkpoints it subsumes,
and a materialization that fails tombstones what it wrote. Chunks of a materialization
that never reached a checkpoint are left when its process is killed mid-write, or when
its host-local store is deleted (a rescale, a subtask that moved away, an idle store)
before a task applied it. Nothing names them, so nothing else ever removes them: over
months of restarts they would grow without bound. The sweep reads the live keys of the
snapshot topic and tombstones those that, by the rules below, no checkpoint can name.

A live key ``{backend}/{key_group}/{materialization}/{chunk}`` is

- **kept** when a stored checkpoint of any application on the checkpoint topic, or a
  subtask's committed part of a checkpoint in the making, names it;
- **swept** when such a checkpoint or part names the same backend at a *newer*
  materialization: a backend's materializations only move forward (a backend never hands
  out an older one again, and a job writing an older one is refused when it is applied);
- **swept** when nothing names its backend at all and its materialization started more
  than ``grace_s`` ago: a backend's first checkpoint follows its first materialization
  within a checkpoint interval, so a backend named by nothing for that long is gone;
- **kept** otherwise, and whenever the key is not of that form (never remove what is
  not understood).

Applications that share a snapshot topic share its checkpoint topic (enforced when a
driver starts), so the checkpoints read are all that can name a chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .materialization import materialized_at
from .snapshot import SnapshotHandle
from .snapshot_store import LiveKey

#: The default of how long a chunk of a backend that nothing names is kept: an hour.
DEFAULT_SWEEP_GRACE_S = 3600.0
#: The default of how often a driver sweeps its snapshot topic: every six hours.
DEFAULT_SWEEP_INTERVAL_S = 6 * 3600.0


@dataclass(frozen=True)
class ChunkKey:
    """The parts of a chunk's record key."""

    backend_id: str
    key_group: int
    materialization_id: int
    chunk_no: int

    @staticmethod
    def parse(key: str) -> ChunkKey | None:
        """The parts of ``key``; None when it is not a chunk key (the backend id may
        contain ``/``: the last three parts are numbers)."""
        parts = key.rsplit("/", 3)
        if len(parts) != 4 or not parts[0]:
            return None
        try:
            key_group, materialization_id, chunk_no = (int(p) for p in parts[1:])
        except ValueError:
            return None
        return ChunkKey(parts[0], key_group, materialization_id, chunk_no)


@dataclass(frozen=True)
class SweepReport:
    """What one sweep found and removed."""

    live: int
    named: int
    swept: int
    #: Unnamed chunks of backends nothing names, kept because they are younger than the
    #: grace (a materialization whose checkpoint is still to come).
    kept_young: int


def chunks_to_sweep(live: Sequence[LiveKey], named: Iterable[SnapshotHandle], now_s: float,
                    grace_s: float) -> tuple[list[LiveKey], SweepReport]:
    """The live keys no checkpoint can name any more (module docstring), and the report.

    ``named``: the snapshot handles of every stored checkpoint and committed subtask part
    of every application on the checkpoint topic.
    """
    named_keys: set[str] = set()
    newest: dict[str, int] = {}
    for handle in named:
        newest[handle.backend_id] = max(newest.get(handle.backend_id, -1),
                                        handle.materialization_id)
        named_keys.update(chunk.record_key(handle.backend_id) for chunk in handle.chunks)
    doomed: list[LiveKey] = []
    young = 0
    for key in live:
        if key.key in named_keys:
            continue
        parts = ChunkKey.parse(key.key)
        if parts is None:
            continue
        named_at = newest.get(parts.backend_id)
        if named_at is not None:
            if parts.materialization_id < named_at:
                doomed.append(key)
        elif now_s - materialized_at(parts.materialization_id) > grace_s:
            doomed.append(key)
        else:
            young += 1
    return doomed, SweepReport(len(live), len(live) - len(doomed) - young, len(doomed), young)


__all__ = ["DEFAULT_SWEEP_GRACE_S", "DEFAULT_SWEEP_INTERVAL_S", "ChunkKey", "SweepReport",
           "chunks_to_sweep"]
