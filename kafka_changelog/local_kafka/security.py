"""SASL authentication and ACL authorization settings for the local cluster."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Mechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]

CLIENT_LISTENER = "SASL_PLAINTEXT"
"""Name (and protocol) of the client and inter-broker listener when security is on."""

AUTHORIZER_CLASS = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

# The controller listener stays PLAINTEXT: SCRAM credentials live in the metadata
# log the controllers serve, so controllers cannot authenticate each other with
# them. Connections there carry the ANONYMOUS principal, which must be a super
# user for brokers to register and fetch metadata. That listener only listens on
# the loopback interface and is never handed to clients.
CONTROLLER_PRINCIPAL = "User:ANONYMOUS"

_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_USER_NAME = re.compile(r"^[A-Za-z0-9._@-]+$")
_PASSWORD_FORBIDDEN = set('"\\,[]=\n\r\t ')  # would break the JAAS or --add-scram syntax


@dataclass(frozen=True)
class SecurityConfig:
    """SASL/ACL setup of a secured cluster.

    Args:
        mechanism: SASL mechanism on the client listener.
        users: user name -> password; every user can authenticate.
        admin: the user that is a super user (also used between brokers and by
            the harness itself); must be a key of ``users``.
    """

    mechanism: Mechanism = "SCRAM-SHA-256"
    users: Mapping[str, str] = field(default_factory=lambda: {"admin": "admin-secret"})
    admin: str = "admin"

    def __post_init__(self) -> None:
        if self.mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
            raise ValueError(f"unsupported SASL mechanism {self.mechanism!r}")
        if self.admin not in self.users:
            raise ValueError(
                f"the admin user {self.admin!r} must be one of the users {sorted(self.users)}"
            )
        for name, password in self.users.items():
            if not _USER_NAME.match(name):
                raise ValueError(f"user name {name!r} may only use letters, digits and ._@-")
            bad = sorted(_PASSWORD_FORBIDDEN.intersection(password))
            if not password or bad:
                raise ValueError(
                    f"the password of user {name!r} must be non-empty and free of {bad!r}"
                )

    @property
    def admin_password(self) -> str:
        """Password of the super user."""
        return self.users[self.admin]

    @property
    def super_users(self) -> list[str]:
        """Principals that bypass ACLs: the admin and the controller listener's principal."""
        return [f"User:{self.admin}", CONTROLLER_PRINCIPAL]

    def broker_settings(self) -> dict[str, str]:
        """Broker properties for SASL on the client listener plus the KRaft authorizer."""
        mechanism_key = self.mechanism.lower()
        return {
            "sasl.enabled.mechanisms": self.mechanism,
            "sasl.mechanism.inter.broker.protocol": self.mechanism,
            f"listener.name.{CLIENT_LISTENER.lower()}.{mechanism_key}.sasl.jaas.config": (
                self._jaas_config()
            ),
            "authorizer.class.name": AUTHORIZER_CLASS,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": ";".join(self.super_users),
        }

    def scram_format_arguments(self) -> list[str]:
        """``StorageTool format --add-scram`` values creating every user (none for PLAIN)."""
        if self.mechanism == "PLAIN":
            return []
        return [
            f"{self.mechanism}=[name={name},password={password}]"
            for name, password in self.users.items()
        ]

    def client_settings(
        self, user: str | None = None, password: str | None = None
    ) -> dict[str, str]:
        """librdkafka settings to authenticate as ``user`` (default: the admin).

        Without ``password`` the user's password from :attr:`users` is used.
        """
        name = self.admin if user is None else user
        if password is None:
            if name not in self.users:
                raise KeyError(f"unknown user {name!r}; known users: {sorted(self.users)}")
            password = self.users[name]
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": self.mechanism,
            "sasl.username": name,
            "sasl.password": password,
        }

    def _jaas_config(self) -> str:
        # The username/password pair is what this broker presents to other brokers.
        own = f'username="{self.admin}" password="{self.admin_password}"'
        if self.mechanism == "PLAIN":
            accounts = " ".join(f'user_{n}="{p}"' for n, p in self.users.items())
            return f"{_PLAIN_MODULE} required {own} {accounts};"
        return f"{_SCRAM_MODULE} required {own};"
