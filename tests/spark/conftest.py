"""A local Spark session shared by the Spark tests (``local[2]``, loopback only); the
standalone cluster (``spark_cluster``) is the cluster modules', in ``tests/conftest.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """``local_session(parallelism=2)`` with ``format("kafka-changelog")`` registered (reads
    and state writes); stopped at the end."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from spark_integration import register
    from spark_integration.sessions.session import local_session

    session = local_session(
        app_name="kafka-changelog-tests",
        parallelism=2,
        extra_config={"spark.driver.host": "127.0.0.1",
                      "spark.driver.bindAddress": "127.0.0.1"},
    )
    register(session)
    try:
        yield session
    finally:
        session.stop()
