"""Loopback ports for the local clusters."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports that are free on ``host`` right now.

    All sockets stay bound until every port is picked, so the kernel cannot hand
    out the same port twice. (Another process could still grab one before the
    broker binds it; that is rare and shows up as a clear start error.)
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


#: Lowest port :func:`consecutive_free_ports` hands out (below it: well-known services).
LOWEST_FIXED_PORT = 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    """First port the kernel hands to outgoing connections (Linux; 32768 elsewhere)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def consecutive_free_ports(count: int, host: str = LOOPBACK, attempts: int = 200) -> int:
    """The first of ``count`` consecutive ports that are free on ``host``.

    For a process that must listen on fixed, consecutive ports (``kafka-changelog broker
    --port P --nodes 3``). The ports lie below the kernel's ephemeral range: a port from
    :func:`free_ports` is free only until the kernel gives it to some client's outgoing
    connection, which makes a listener started a moment later fail to bind.
    """
    high = _ephemeral_low() - count
    if high <= LOWEST_FIXED_PORT:
        raise RuntimeError(f"no room for {count} ports below the ephemeral range "
                           f"(it starts at {high + count})")
    for _ in range(attempts):
        base = random.randrange(LOWEST_FIXED_PORT, high)
        if all(_bindable(host, base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on {host} between "
                       f"{LOWEST_FIXED_PORT} and {high + count} after {attempts} tries")


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
