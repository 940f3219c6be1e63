"""The storage contract, for the in-memory reference storage."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_changelog import InMemoryChangelogStorage
from kafka_changelog.testing.contract import ChangelogStorageContract


class TestInMemoryStorageContract(ChangelogStorageContract):
    @pytest.fixture
    def storage(self) -> Iterator[InMemoryChangelogStorage]:
        with InMemoryChangelogStorage() as storage:
            yield storage
