"""Which producer of this machine took a transactional id over last.

Spark hands a subtask's task to whichever Python worker of its host is free, and each worker
keeps its producer of the subtask's transactional id across batches. The worker that runs
the task initializes its producer, which fences the others at the broker; a fenced producer
learns it only from its next transaction, which fails (librdkafka logs a fatal error) after
round trips to the broker. A small file per transactional id, rewritten by every producer of
this machine right after its ``init_transactions``, tells a committer before it begins that
its producer was taken over: it then takes the id back the way a failed transaction would
end, without the failed transaction.

The file is a hint, never a guarantee: fencing stays the broker's. A producer on another
machine, or one that took the id over between another's check and its transaction, is
still found out by the broker, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import uuid
from pathlib import Path


def owner_directory() -> Path:
    """Where this user's owner files live (the machine's temporary directory)."""
    return Path(tempfile.gettempdir()) / f"kafka-changelog-txn-owners-{os.getuid()}"


class TransactionalIdOwner:
    """The owner file of one transactional id on one cluster, seen by one producer.

    Invariant: :meth:`taken_over` is True only after another producer of this machine
    claimed the id since this one's last :meth:`claim` (a missing or unreadable file
    counts as not taken over).
    """

    def __init__(self, bootstrap_servers: str, transactional_id: str,
                 directory: Path | None = None) -> None:
        name = hashlib.sha256(f"{bootstrap_servers}\0{transactional_id}".encode()).hexdigest()
        self.path = (directory or owner_directory()) / name[:32]
        self._token: str | None = None

    def claim(self) -> None:
        """Record that this producer is the id's current one (call after its
        ``init_transactions``). Written atomically; a machine without a writable temporary
        directory only loses the hint."""
        token = uuid.uuid4().hex
        partial = self.path.with_name(f"{self.path.name}.{token}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(token, encoding="ascii")
            os.replace(partial, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                partial.unlink()
            self._token = None
            return
        self._token = token

    def taken_over(self) -> bool:
        """Whether another producer of this machine claimed the id since this one did."""
        if self._token is None:
            return False
        try:
            return self.path.read_text(encoding="ascii") != self._token
        except OSError:
            return False


__all__ = ["TransactionalIdOwner", "owner_directory"]
