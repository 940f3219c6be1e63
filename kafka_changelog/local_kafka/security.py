"""Authentication (SASL, TLS client certificates), encryption (TLS) and ACL authorization
settings for the local cluster."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from kafka_changelog.local_kafka.tls import BROKER_COMMON_NAME, TlsFiles

Mechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]


class SecurityProtocol(Enum):
    """The protocol (and listener name) of the client and inter-broker listener."""

    #: SASL over plain TCP.
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    #: SASL over TLS (what managed Kafka services speak).
    SASL_SSL = "SASL_SSL"
    #: TLS with client certificates: a client's principal is its certificate's CN.
    SSL = "SSL"

    @property
    def uses_tls(self) -> bool:
        """Whether the listener speaks TLS."""
        return self is not SecurityProtocol.SASL_PLAINTEXT

    @property
    def uses_sasl(self) -> bool:
        """Whether clients authenticate with SASL (else with a certificate)."""
        return self is not SecurityProtocol.SSL


# A client certificate's subject ``CN=alice`` is the principal ``User:alice``.
_PRINCIPAL_MAPPING = "RULE:^CN=([^,]+)$/$1/,DEFAULT"

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
        mechanism: SASL mechanism on the client listener (with SASL protocols).
        users: user name -> password; every user can authenticate (with
            ``SecurityProtocol.SSL``, by the client certificate made for it).
        admin: the user that is a super user (also used between brokers and by
            the harness itself); must be a key of ``users``.
        protocol: the client and inter-broker listener's protocol.
        client_certificates: with TLS, whether the brokers require a client
            certificate signed by the cluster's authority (mutual TLS; always with
            ``SecurityProtocol.SSL``).
    """

    mechanism: Mechanism = "SCRAM-SHA-256"
    users: Mapping[str, str] = field(default_factory=lambda: {"admin": "admin-secret"})
    admin: str = "admin"
    protocol: SecurityProtocol = SecurityProtocol.SASL_PLAINTEXT
    client_certificates: bool = False

    def __post_init__(self) -> None:
        if self.mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
            raise ValueError(f"unsupported SASL mechanism {self.mechanism!r}")
        if not isinstance(self.protocol, SecurityProtocol):
            raise TypeError(f"protocol must be a SecurityProtocol, got {self.protocol!r}")
        if self.client_certificates and not self.protocol.uses_tls:
            raise ValueError(f"client certificates need a TLS protocol, not "
                             f"{self.protocol.value}")
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
    def listener(self) -> str:
        """The client and inter-broker listener's name (its protocol's)."""
        return self.protocol.value

    @property
    def requires_client_certificates(self) -> bool:
        """Whether a client must present a certificate (mutual TLS)."""
        return self.client_certificates or self.protocol is SecurityProtocol.SSL

    @property
    def super_users(self) -> list[str]:
        """Principals that bypass ACLs: the admin, the controller listener's principal and,
        with TLS, the brokers' own certificate (their principal between them)."""
        users = [f"User:{self.admin}", CONTROLLER_PRINCIPAL]
        if self.protocol.uses_tls:
            users.append(f"User:{BROKER_COMMON_NAME}")
        return users

    def broker_settings(self, tls: TlsFiles | None = None) -> dict[str, str]:
        """Broker properties of the client listener (SASL, TLS with ``tls``'s files) and
        the KRaft authorizer."""
        settings = {
            "authorizer.class.name": AUTHORIZER_CLASS,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": ";".join(self.super_users),
        }
        listener = self.listener.lower()
        if self.protocol.uses_sasl:
            settings |= {
                "sasl.enabled.mechanisms": self.mechanism,
                "sasl.mechanism.inter.broker.protocol": self.mechanism,
                f"listener.name.{listener}.{self.mechanism.lower()}.sasl.jaas.config": (
                    self._jaas_config()
                ),
            }
        if self.protocol.uses_tls:
            if tls is None:
                raise ValueError(f"{self.protocol.value} needs the cluster's TLS files")
            prefix = f"listener.name.{listener}."
            settings |= {
                f"{prefix}ssl.keystore.type": "PEM",
                f"{prefix}ssl.keystore.location": str(tls.broker.keystore(tls.authority)),
                f"{prefix}ssl.truststore.type": "PEM",
                f"{prefix}ssl.truststore.location": str(tls.authority.certificate),
                f"{prefix}ssl.client.auth": ("required" if self.requires_client_certificates
                                             else "none"),
                "ssl.principal.mapping.rules": _PRINCIPAL_MAPPING,
            }
        return settings

    def scram_format_arguments(self) -> list[str]:
        """``StorageTool format --add-scram`` values creating every user (none for PLAIN)."""
        if self.mechanism == "PLAIN":
            return []
        return [
            f"{self.mechanism}=[name={name},password={password}]"
            for name, password in self.users.items()
        ]

    def client_settings(
        self, user: str | None = None, password: str | None = None,
        tls: TlsFiles | None = None,
    ) -> dict[str, str]:
        """librdkafka settings to authenticate as ``user`` (default: the admin).

        Without ``password`` the user's password from :attr:`users` is used. With TLS,
        the client trusts ``tls``'s authority and, with client certificates, presents
        the user's certificate.
        """
        name = self.admin if user is None else user
        if password is None:
            if name not in self.users:
                raise KeyError(f"unknown user {name!r}; known users: {sorted(self.users)}")
            password = self.users[name]
        settings = {"security.protocol": self.protocol.value}
        if self.protocol.uses_sasl:
            settings |= {
                "sasl.mechanism": self.mechanism,
                "sasl.username": name,
                "sasl.password": password,
            }
        if self.protocol.uses_tls:
            if tls is None:
                raise ValueError(f"{self.protocol.value} needs the cluster's TLS files")
            settings["ssl.ca.location"] = str(tls.authority.certificate)
            if self.requires_client_certificates:
                if name not in tls.clients:
                    raise KeyError(f"no client certificate for user {name!r}; made for "
                                   f"{sorted(tls.clients)}")
                settings["ssl.certificate.location"] = str(tls.clients[name].certificate)
                settings["ssl.key.location"] = str(tls.clients[name].key)
        return settings

    def _jaas_config(self) -> str:
        # The username/password pair is what this broker presents to other brokers.
        own = f'username="{self.admin}" password="{self.admin_password}"'
        if self.mechanism == "PLAIN":
            accounts = " ".join(f'user_{n}="{p}"' for n, p in self.users.items())
            return f"{_PLAIN_MODULE} required {own} {accounts};"
        return f"{_SCRAM_MODULE} required {own};"
