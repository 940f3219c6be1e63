"""Which subtask each partition of a new placement runs: a subtask goes back to a host
that holds a store of it.

A placement (:mod:`spark_integration.streaming.subtask_partitioning`) is ``parallelism`` cached
partitions, each on the host whose executor first computed it; Spark decides where. When
the driver makes a placement anew (executors joined: a host came back, a worker was
added), the subtasks need not run in the partitions of their own numbers: the driver
computes the new placement first, in a small job whose tasks say where each partition is
cached (:func:`placement_hosts`), and gives each partition the subtask that has a store on
that host (:func:`assign`): a subtask that stayed on its host keeps it, and a subtask back
on a host it ran on catches up from its store instead of restoring from Kafka. (When hosts
leave, the placement is kept: only the lost hosts' partitions are computed again,
elsewhere.)

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
    """The hosts each subtask ran on at one parallelism (each keeps a store of it), with
    the batch it ran there last (counted from 1 by :meth:`record`)."""

    parallelism: int
    #: Subtask -> host -> the latest batch (a count of :meth:`record` calls) it ran there.
    last_ran: dict[int, dict[str, int]] = field(default_factory=dict)
    batches: int = 0

    def record(self, hosts: Mapping[int, str]) -> None:
        """Subtask -> the host it ran on in a batch (an empty host: not known)."""
        self.batches += 1
        for subtask, host in hosts.items():
            if host:
                self.last_ran.setdefault(subtask, {})[host] = self.batches


def assign(partition_hosts: Mapping[int, str], hosts: SubtaskHosts) -> tuple[int, ...]:
    """Partition -> subtask (a permutation of ``0..parallelism-1``) that keeps every
    subtask it can on the host it ran on last, and sends the others to the host of their
    most recent store among those the partitions are on.

    Greedy, one subtask at a time: the next is the one whose best free host (where it
    ran most recently) it left last; of those, the one whose next-best host is the
    oldest (it has the most to lose). So when a host comes back, the subtasks that stayed
    on theirs keep them, and the subtask that left the returning host goes back to it
    (a catch-up from its store) rather than one that has been away longer. Subtasks with
    no store on any free host take the partitions left, in order; the partitions of one
    host go to its subtasks in subtask order."""
    parallelism = hosts.parallelism
    partitions_of: dict[str, list[int]] = {}
    for partition in range(parallelism):
        partitions_of.setdefault(partition_hosts.get(partition, ""), []).append(partition)
    free = {host: len(partitions) for host, partitions in partitions_of.items()}

    def ranked(subtask: int) -> list[tuple[int, str]]:
        """(the batch the subtask last ran there, host) of each host with a free
        partition, latest first (a subtask runs on one host per batch: no ties)."""
        ran = hosts.last_ran.get(subtask, {})
        return sorted(((batch, host) for host, batch in ran.items() if free.get(host)),
                      reverse=True)

    host_of: dict[int, str] = {}
    waiting = set(range(parallelism))
    while True:
        best: tuple[tuple[int, int, int], int, str] | None = None
        for subtask in waiting:
            choices = ranked(subtask)
            if not choices:
                continue
            next_best = choices[1][0] if len(choices) > 1 else 0
            key = (choices[0][0], -next_best, -subtask)
            if best is None or key > best[0]:
                best = (key, subtask, choices[0][1])
        if best is None:
            break
        _, subtask, host = best
        host_of[subtask] = host
        free[host] -= 1
        waiting.discard(subtask)
    subtask_of: dict[int, int] = {}
    for subtask in sorted(host_of):
        subtask_of[partitions_of[host_of[subtask]].pop(0)] = subtask
    left = iter(sorted(waiting))
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
