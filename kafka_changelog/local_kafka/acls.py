"""Grant and revoke ACLs on a secured local cluster through the AdminClient."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from kafka_changelog.local_kafka.errors import KafkaHarnessError

Operations = Iterable[AclOperation | str] | AclOperation | str


def principal_of(user_or_principal: str) -> str:
    """``"alice"`` -> ``"User:alice"``; a full principal (``"User:alice"``) is kept."""
    return user_or_principal if ":" in user_or_principal else f"User:{user_or_principal}"


def _operations(operations: Operations) -> list[AclOperation | str]:
    if isinstance(operations, (AclOperation, str)):
        return [operations]
    return list(operations)


def grant(
    admin: AdminClient,
    principal: str,
    resource_type: ResourceType | str,
    name: str,
    operations: Operations,
    *,
    pattern_type: ResourcePatternType | str = ResourcePatternType.LITERAL,
    host: str = "*",
    timeout: float = 30.0,
) -> list[AclBinding]:
    """Allow ``principal`` the ``operations`` on resource ``resource_type``/``name``.

    Example: ``grant(admin, "alice", "TOPIC", "orders", ["READ", "DESCRIBE"])``.
    Returns the created bindings once the controller has committed them (brokers
    apply them a moment later).
    """
    bindings = [
        AclBinding(
            resource_type,
            name,
            pattern_type,
            principal_of(principal),
            host,
            operation,
            AclPermissionType.ALLOW,
        )
        for operation in _operations(operations)
    ]
    _wait(admin.create_acls(bindings, request_timeout=timeout), timeout, "create")
    return bindings


def revoke(
    admin: AdminClient,
    principal: str,
    resource_type: ResourceType | str,
    name: str,
    operations: Operations,
    *,
    pattern_type: ResourcePatternType | str = ResourcePatternType.LITERAL,
    host: str = "*",
    timeout: float = 30.0,
) -> None:
    """Remove ALLOW bindings that :func:`grant` with the same arguments created."""
    filters = [
        AclBindingFilter(
            resource_type,
            name,
            pattern_type,
            principal_of(principal),
            host,
            operation,
            AclPermissionType.ALLOW,
        )
        for operation in _operations(operations)
    ]
    _wait(admin.delete_acls(filters, request_timeout=timeout), timeout, "delete")


def _wait(futures: Mapping[Any, Future[Any]], timeout: float, verb: str) -> None:
    failures = []
    for binding, future in futures.items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            failures.append(f"{binding}: {exc.args[0]}")
    if failures:
        raise KafkaHarnessError(f"could not {verb} ACLs: " + "; ".join(failures))
