"""Which subtask each partition of a new placement runs (pure: no Spark)."""

from __future__ import annotations

from spark_integration.streaming.subtask_hosts import SubtaskHosts, assign, inverse


def hosts_of(parallelism: int, ran_on: dict[int, list[str]]) -> SubtaskHosts:
    hosts = SubtaskHosts(parallelism)
    for subtask, seen in ran_on.items():
        for host in seen:
            hosts.record({subtask: host})
    return hosts


def test_a_host_back_gets_the_subtask_that_ran_there_before() -> None:
    # Subtask 0 ran on B, then (B lost) on A with subtask 1; B is back and the new
    # placement's partition 0 is on A, partition 1 on B.
    hosts = hosts_of(2, {0: ["B", "A"], 1: ["A"]})
    assert assign({0: "A", 1: "B"}, hosts) == (1, 0)
    assert assign({0: "B", 1: "A"}, hosts) == (0, 1)


def test_the_host_a_subtask_ran_on_last_wins() -> None:
    hosts = hosts_of(2, {0: ["A", "B"], 1: ["B", "A"]})
    assert assign({0: "A", 1: "B"}, hosts) == (1, 0)
    hosts.record({0: "A", 1: "B"})
    assert assign({0: "A", 1: "B"}, hosts) == (0, 1)


def test_subtasks_without_a_store_on_the_hosts_take_the_partitions_left_in_order() -> None:
    hosts = hosts_of(4, {2: ["C"], 3: ["X"]})
    assert assign({0: "A", 1: "C", 2: "A", 3: "B"}, hosts) == (0, 2, 1, 3)
    assert assign({}, SubtaskHosts(3)) == (0, 1, 2)


def test_two_partitions_on_one_host_take_two_of_its_subtasks() -> None:
    hosts = hosts_of(3, {0: ["B"], 1: ["A"], 2: ["A"]})
    assert assign({0: "A", 1: "A", 2: "B"}, hosts) == (1, 2, 0)


def test_when_a_host_is_back_the_subtasks_that_stayed_keep_theirs() -> None:
    # Three hosts, one subtask each; B is lost and its subtask 1 runs on A with subtask
    # 0; B is back: subtask 1 goes back to B, the others stay.
    hosts = SubtaskHosts(3)
    for _ in range(3):
        hosts.record({0: "A", 1: "B", 2: "C"})
    for _ in range(2):
        hosts.record({0: "A", 1: "A", 2: "C"})
    assert assign({0: "C", 1: "B", 2: "A"}, hosts) == (2, 1, 0)
    # Later C is lost, its subtask 2 runs on A (next to 0), which once held subtask 1's
    # store too; C is back: subtask 2 goes back to C, not 1 (away from A for longer).
    for _ in range(3):
        hosts.record({0: "A", 1: "B", 2: "C"})
    hosts.record({0: "A", 1: "B", 2: "A"})
    assert assign({0: "A", 1: "B", 2: "C"}, hosts) == (0, 1, 2)


def test_of_two_subtasks_on_a_host_the_one_that_left_the_free_host_last_moves() -> None:
    # Subtasks 1 and 2 both run on B now (C was lost twice: 2 ran there until batch 3,
    # then 1 until batch 6); C is back and one of them must go: 1, whose store on C is
    # the more recent (the shorter catch-up).
    hosts = SubtaskHosts(3)
    hosts.record({0: "A", 1: "B", 2: "C"})
    hosts.record({0: "A", 1: "B", 2: "C"})
    hosts.record({0: "A", 1: "C", 2: "C"})
    hosts.record({0: "A", 1: "C", 2: "B"})
    hosts.record({0: "A", 1: "C", 2: "B"})
    hosts.record({0: "A", 1: "C", 2: "B"})
    hosts.record({0: "A", 1: "B", 2: "B"})
    assert assign({0: "A", 1: "B", 2: "C"}, hosts) == (0, 2, 1)


def test_an_unknown_host_is_not_recorded_and_inverse_inverts() -> None:
    hosts = SubtaskHosts(2)
    hosts.record({0: "", 1: "A"})
    assert hosts.last_ran == {1: {"A": 1}}
    assert inverse((2, 0, 1)) == (1, 2, 0)
    assert inverse(inverse((2, 0, 1))) == (2, 0, 1)
