"""Exceptions of the local Kafka: its clusters, their jars and the tools they need."""

from __future__ import annotations


class KafkaHarnessError(RuntimeError):
    """Base class for errors of the local Kafka (not of the library it runs for)."""


class ToolMissingError(KafkaHarnessError):
    """A program the local Kafka needs (``java``, ``mvn``, ``kcat``) is not installed."""


class JarsUnavailableError(KafkaHarnessError):
    """The Kafka broker jars could not be found or downloaded."""


class DockerUnavailableError(KafkaHarnessError):
    """No Docker engine is reachable for the container-based cluster."""


class BrokerStartError(KafkaHarnessError):
    """A broker did not come up (or did not come back) within its timeout.

    ``node`` is the index of the node at fault when one is known, ``exit_code``
    its exit status if it died, and ``log_tail`` the last lines of its log(s).
    """

    def __init__(
        self,
        message: str,
        *,
        node: int | None = None,
        exit_code: int | None = None,
        log_tail: str = "",
    ) -> None:
        self.node = node
        self.exit_code = exit_code
        self.log_tail = log_tail
        details = [message]
        if node is not None:
            details.append(f"node index: {node}")
        if exit_code is not None:
            details.append(f"exit code: {exit_code}")
        if log_tail:
            details.append(f"last log lines:\n{log_tail}")
        super().__init__("\n".join(details))
