"""Ports for listeners on fixed, consecutive ports (``kafka-changelog broker --nodes 3``)."""

from __future__ import annotations

import socket

import pytest

from kafka_changelog.local_kafka import net


def test_consecutive_ports_are_free_and_below_the_ephemeral_range() -> None:
    base = net.consecutive_free_ports(3)
    assert base >= net.LOWEST_FIXED_PORT and base + 3 <= net._ephemeral_low()
    sockets = [socket.socket() for _ in range(3)]
    try:
        for i, sock in enumerate(sockets):
            sock.bind((net.LOOPBACK, base + i))  # raises if one was taken
    finally:
        for sock in sockets:
            sock.close()


def test_a_taken_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    really_bindable = net._bindable
    with socket.socket() as taken:
        taken.bind((net.LOOPBACK, 0))
        port = taken.getsockname()[1]
        # Only the taken port is probed for real: its neighbours may belong to any other
        # process on a busy machine, which is not what this test is about.
        monkeypatch.setattr(net, "_bindable", lambda host, candidate: (
            really_bindable(host, candidate) if candidate == port else True))
        candidates = iter([port - 1, port + 1])
        monkeypatch.setattr(net.random, "randrange", lambda low, high: next(candidates))
        monkeypatch.setattr(net, "LOWEST_FIXED_PORT", 1024)
        monkeypatch.setattr(net, "_ephemeral_low", lambda: 65535)
        assert net.consecutive_free_ports(2) == port + 1


def test_no_room_is_an_error_naming_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "_ephemeral_low", lambda: net.LOWEST_FIXED_PORT + 2)
    with pytest.raises(RuntimeError, match="no room for 3 ports below the ephemeral range"):
        net.consecutive_free_ports(3)
