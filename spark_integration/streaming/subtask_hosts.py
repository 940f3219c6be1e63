"""Which subtask each partition of a new placement runs: a subtask goes back to a host
that holds a store of it.

A placement (:mod:`spark_integration.streaming.subtask_partitioning`) is ``parallelism`` cached
partitions, each on the host whose executor first computed it; Spark decides where. When
the driver makes a placement anew (executors joined: a host came back, a worker was
added), the subtasks need not run in the partitions of their own numbers: the driver
computes the new placement first, in a small job whose tasks say where each partition is
cached (:func:`placement_hosts`), and gives each partition the subtask that has a store on
that host (:func:`assign`), the one that ran there last first: a subtask back on a host
it ran on catches up from its store instead of restoring from Kafka.

What the driver knows of where subtasks ran comes from the tasks' reports
(``SubtaskMetrics.host``) since the driver started (:class:`SubtaskHosts`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..sessions.connect import is_connect
from .config import StreamingStateConfig

logger = logging.getLogger(__name__)


def host_identity(config: StreamingStateConfig) -> str:
    """Where a task runs, as far as its subtask's store goes: the host's name and its
    host-local state directory (hosts of one machine differ by directory)."""
    return f"{socket.gethostname()}:{config.local_state_root()}"


@dataclass
class SubtaskHosts:
    """The hosts each subtask ran on at one parallelism (each keeps a store of it), the
    most recent last."""

    parallelism: int
    ran_on: dict[int, list[str]] = field(default_factory=dict)

    def record(self, hosts: Mapping[int, str]) -> None:
        """Subtask -> the host it ran on in a batch (an empty host: not known)."""
        for subtask, host in hosts.items():
            if not host:
                continue
            seen = self.ran_on.setdefault(subtask, [])
            if host in seen:
                seen.remove(host)
            seen.append(host)


def assign(partition_hosts: Mapping[int, str], hosts: SubtaskHosts) -> tuple[int, ...]:
    """Partition -> subtask (a permutation of ``0..parallelism-1``): each subtask takes a
    partition on the host it ran on last among those the partitions are on, the subtasks
    with the fewest such hosts first; the others take the partitions left, in order."""
    parallelism = hosts.parallelism
    free: dict[str, list[int]] = {}
    for partition in range(parallelism):
        free.setdefault(partition_hosts.get(partition, ""), []).append(partition)

    def choices(subtask: int) -> list[str]:
        return [h for h in reversed(hosts.ran_on.get(subtask, [])) if h in free]

    subtask_of: dict[int, int] = {}
    for subtask in sorted(range(parallelism), key=lambda s: (len(choices(s)), s)):
        for host in choices(subtask):
            if free[host]:
                subtask_of[free[host].pop(0)] = subtask
                break
    left = iter(s for s in range(parallelism) if s not in subtask_of.values())
    return tuple(subtask_of[p] if p in subtask_of else next(left) for p in range(parallelism))


def placement_hosts(placement: Any, config: StreamingStateConfig) -> dict[int, str] | None:
    """Compute and cache ``placement`` (a DataFrame) in a job of its own; partition ->
    the host it is cached on. None where it cannot be told (Spark Connect has no RDDs,
    or the job failed: the batch then runs with the partitions in order)."""
    if is_connect(placement.sparkSession):
        return None  # no RDDs: the probe job cannot run
    try:
        found = placement.rdd.mapPartitionsWithIndex(_reporter(config)).collect()
    except Exception as exc:  # py4j, Connect's unsupported RDD API, a lost executor
        logger.info("where the new subtask placement is cached is not known (%s): "
                    "partition i runs subtask i", exc)
        return None
    return dict(found)


def _reporter(config: StreamingStateConfig
              ) -> Callable[[int, Iterable[Any]], Iterator[tuple[int, str]]]:
    def report(partition: int, rows: Iterable[Any]) -> Iterator[tuple[int, str]]:
        for _ in rows:  # compute (and cache) the partition
            pass
        yield partition, host_identity(config)

    return report


def inverse(partition_subtasks: Sequence[int]) -> tuple[int, ...]:
    """Subtask -> partition, of partition -> subtask."""
    partition_of = [0] * len(partition_subtasks)
    for partition, subtask in enumerate(partition_subtasks):
        partition_of[subtask] = partition
    return tuple(partition_of)


__all__ = ["SubtaskHosts", "assign", "host_identity", "inverse", "placement_hosts"]
