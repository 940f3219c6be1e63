"""Who may take an application over from the driver claim found (no broker needed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from kafka_changelog.state.checkpoints.driver_claim import (
    DriverClaim,
    DriverIdentity,
    Takeover,
    driver_claim_key,
    parse_driver_claim_key,
)

NOW = 1_800_000_000_000
LEASE_S = 60.0
HERE = DriverIdentity.of_this_process()
ELSEWHERE = DriverIdentity("e" * 32, "another-host", 4242, "123")


def a_claim(driver: DriverIdentity = ELSEWHERE, query: str = "query-1",
            heartbeat_ms: int = NOW - 1000, released: bool = False) -> DriverClaim:
    return DriverClaim("orders", 3, driver, query, NOW - 60_000, heartbeat_ms, released)


def a_newcomer() -> DriverIdentity:
    return DriverIdentity("n" * 32, "third-host", 7, "9")


def test_a_live_holder_of_another_query_keeps_the_application() -> None:
    assert a_claim().takeover(a_newcomer(), "query-2", NOW, LEASE_S) is Takeover.HELD


def test_the_same_query_takes_over_a_live_holder_at_once() -> None:
    assert a_claim().takeover(a_newcomer(), "query-1", NOW, LEASE_S) is Takeover.SAME_QUERY
    # Without a query (a batch run by hand) nothing is "the same query".
    assert a_claim(query="").takeover(a_newcomer(), "", NOW, LEASE_S) is Takeover.HELD


def test_a_released_or_expired_claim_is_free() -> None:
    assert a_claim(released=True).takeover(a_newcomer(), "q", NOW, LEASE_S) is Takeover.FREE
    expired = a_claim(heartbeat_ms=NOW - int(LEASE_S * 1000) - 1)
    assert expired.takeover(a_newcomer(), "q", NOW, LEASE_S) is Takeover.FREE
    just_alive = a_claim(heartbeat_ms=NOW - int(LEASE_S * 1000))
    assert just_alive.takeover(a_newcomer(), "q", NOW, LEASE_S) is Takeover.HELD


def test_a_holder_process_of_this_host_that_is_gone_frees_the_application() -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    gone = DriverIdentity("g" * 32, socket.gethostname(), int(child.stdout), "1")
    assert gone.is_gone()
    assert a_claim(gone).takeover(a_newcomer(), "q", NOW, LEASE_S) is Takeover.FREE
    # This process is alive; a reused pid with another start time is another process.
    assert not HERE.is_gone()
    reused = DriverIdentity("r" * 32, HERE.host, os.getpid(), HERE.process_started + "0")
    assert reused.is_gone()
    assert a_claim(HERE).takeover(a_newcomer(), "q", NOW, LEASE_S) is Takeover.HELD


def test_this_process_holds_its_own_claim() -> None:
    assert a_claim(HERE).takeover(HERE, "other", NOW, LEASE_S) is Takeover.OWN


def test_a_claim_round_trips_and_its_key_names_the_application() -> None:
    claim = a_claim(HERE)
    assert DriverClaim.from_bytes(claim.to_bytes(), "here") == claim
    assert driver_claim_key("orders") == "orders/driver"
    assert parse_driver_claim_key("orders/driver") == "orders"
    assert parse_driver_claim_key("orders/latest") is None
    holder = claim.holder()
    assert holder.holds(claim) and holder.holds(a_claim(HERE, heartbeat_ms=NOW))
    assert not holder.holds(DriverClaim("orders", 4, HERE, "query-1", NOW, NOW))
