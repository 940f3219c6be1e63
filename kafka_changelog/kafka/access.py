"""Connecting with a clear answer: a cause that retrying cannot cure surfaces within
seconds, as its own exception type (see :mod:`.connection_diagnosis`)."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from .connection_diagnosis import decisive_error, unreachable_error
from .error_text import access_error, is_access_error
from .live_clients import new_admin


def connect_admin(
    settings: dict[str, Any], timeout_s: float, purpose: str = "admin calls"
) -> tuple[AdminClient, ClusterMetadata]:
    """An admin client that has seen cluster metadata.

    librdkafka retries a failed SASL or TLS handshake forever; this watches its error
    callback and gives up at the first error retrying cannot cure.

    Raises:
        KafkaAuthenticationError / KafkaAuthorizationError: credentials or ACLs refused.
        KafkaTlsError (a subclass per cause): the TLS handshake failed.
        KafkaUnreachableError: no broker answered within ``timeout_s``, or the listener
            speaks another protocol than ``security.protocol``.
    """
    errors: list[KafkaError] = []
    client_settings: dict[str, Any] = {**settings, "error_cb": errors.append}
    admin = new_admin(client_settings, purpose)
    deadline = time.monotonic() + timeout_s
    probed_protocol = False
    while True:
        try:
            return admin, admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
        except KafkaException as exc:
            last: KafkaError | None = exc.args[0] if exc.args else None
        admin.poll(0)
        denied = [e for e in errors if is_access_error(e)
                  and e.code() not in (KafkaError._AUTHENTICATION,
                                       KafkaError.SASL_AUTHENTICATION_FAILED)]
        if denied:
            raise access_error(denied[0], "reading the cluster's metadata", settings)
        all_down = any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in errors)
        found = decisive_error(settings, errors, probe_protocol=all_down and not probed_protocol)
        probed_protocol = probed_protocol or all_down
        if found is not None:
            raise found
        if time.monotonic() >= deadline:
            raise unreachable_error(settings, errors or ([last] if last else []), timeout_s)
