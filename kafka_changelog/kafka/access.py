"""Connecting with a clear answer: authentication failures surface within seconds."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from ..errors import KafkaAccessError
from .error_text import describe, is_access_error, principal_of


def connect_admin(
    settings: dict[str, Any], timeout_s: float
) -> tuple[AdminClient, ClusterMetadata]:
    """An admin client that has seen cluster metadata, or a :class:`KafkaAccessError`.

    librdkafka retries a failed SASL handshake forever; this watches its error
    callback and gives up at the first authentication error instead of hanging.
    """
    errors: list[KafkaError] = []
    client_settings: dict[str, Any] = {**settings, "error_cb": errors.append}
    admin = AdminClient(client_settings)
    deadline = time.monotonic() + timeout_s
    who = principal_of(settings)
    servers = settings.get("bootstrap.servers")
    while True:
        try:
            return admin, admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
        except KafkaException as exc:
            last: KafkaError | None = exc.args[0] if exc.args else None
        admin.poll(0)
        denied = [e for e in errors if is_access_error(e)]
        if denied:
            raise KafkaAccessError(
                f"Kafka at {servers} refused {who}: {describe(denied[0])}"
            )
        if time.monotonic() >= deadline:
            seen = "; ".join(describe(e) for e in errors[-3:]) or (
                describe(last) if last else "no answer")
            raise KafkaAccessError(
                f"no answer from Kafka at {servers} as {who} within {timeout_s:.0f} s: {seen}"
            )
