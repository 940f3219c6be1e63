"""Why a client cannot connect, told as one exception type per cause.

librdkafka reports a failed TLS handshake, a refused certificate and a refused
connection alike as a broker transport failure and retries them forever. A client that
watches its error callback gives each batch of errors to :func:`decisive_error`, which
returns the exception for a cause that retrying cannot cure (a wrong password, an
untrusted broker certificate, a refused client certificate, a listener that speaks
another protocol) or None to keep trying; :func:`unreachable_error` tells what was seen
once the time is up. An untrusted certificate and a hostname mismatch look the same in
librdkafka's report ("certificate verify failed"): :func:`broker_certificate_error`
tells them apart by repeating the handshake with Python's ``ssl`` and the client's
trust settings.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError

from ..errors import (
    BrokerHostnameMismatchError,
    ClientCertificateRejectedError,
    KafkaAuthenticationError,
    KafkaConnectionError,
    KafkaTlsError,
    KafkaUnreachableError,
    UntrustedBrokerCertificateError,
)
from .error_text import describe, principal_of

_PROBE_TIMEOUT_S = 3.0
# TLS alerts a broker sends when it refuses the client's certificate (or its absence).
_CLIENT_CERTIFICATE_ALERTS = ("alert certificate unknown", "alert bad certificate",
                              "alert certificate required", "alert unknown ca",
                              "alert certificate expired", "alert handshake failure")


def decisive_error(settings: Mapping[str, Any], errors: Sequence[KafkaError], *,
                   probe_protocol: bool = True) -> KafkaConnectionError | None:
    """The exception for the first error among ``errors`` that retrying will not cure
    (None: none is). ``probe_protocol``: when every broker is down, a plaintext client
    checks whether the listener speaks TLS (a handshake per address: do it once)."""
    servers = settings.get("bootstrap.servers", "")
    who = principal_of(dict(settings))
    for error in errors:
        code, text = error.code(), error.str()
        if code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            if "SSL" in text and "SASL" not in text:
                break  # librdkafka files some TLS failures under authentication
            return KafkaAuthenticationError(
                f"Kafka at {servers} refused {who}: {describe(error)}")
    for error in errors:
        text = error.str()
        if "certificate verify failed" in text:
            return broker_certificate_error(settings, _address_in(text) or _first(servers))
        if any(alert in text for alert in _CLIENT_CERTIFICATE_ALERTS):
            return _client_certificate_error(settings, _address_in(text) or _first(servers),
                                             text)
        if error.code() == KafkaError._SSL:
            return KafkaTlsError(f"TLS with the broker at {servers} failed: {text}")
    if probe_protocol and any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in errors):
        return _protocol_mismatch(settings)
    return None


def unreachable_error(settings: Mapping[str, Any], errors: Sequence[KafkaError],
                      timeout_s: float) -> KafkaConnectionError:
    """What to raise when no broker answered within ``timeout_s``."""
    servers = str(settings.get("bootstrap.servers", ""))
    found = decisive_error(settings, errors)
    if found is not None:
        return found
    seen = "; ".join(dict.fromkeys(describe(e) for e in errors[-4:])) or "no answer"
    closed = [a for a in _addresses(servers) if not _accepts_tcp(a)]
    where = (f"nothing listens at {', '.join(closed)}" if closed
             else "the brokers accept connections but never answered")
    return KafkaUnreachableError(
        f"no answer from Kafka at {servers} as {principal_of(dict(settings))} within "
        f"{timeout_s:.0f} s ({where}): {seen}")


def broker_certificate_error(settings: Mapping[str, Any], address: str) -> KafkaTlsError:
    """Why the broker's certificate at ``address`` was not accepted: an untrusted
    authority, or a trusted certificate for other host names."""
    host, port = _split(address)
    trust = _trust_description(settings)
    try:
        context = _client_context(settings)
    except (OSError, ssl.SSLError) as exc:
        return KafkaTlsError(f"cannot load the trusted certificates ({trust}): {exc}")
    context.check_hostname = False
    try:
        certificate = _peer_certificate(context, host, port)
    except ssl.SSLCertVerificationError as exc:
        return UntrustedBrokerCertificateError(
            f"the certificate of the broker at {address} is not signed by an authority the "
            f"client trusts ({trust}): {exc.verify_message}; give the authority that signed "
            f"the brokers' certificates in ssl.ca.location")
    except (OSError, ssl.SSLError) as exc:
        return KafkaTlsError(f"TLS with the broker at {address} failed: {exc}")
    names = [value for kind, value in certificate.get("subjectAltName", ())
             if kind in ("DNS", "IP Address")]
    return BrokerHostnameMismatchError(
        f"the certificate of the broker at {address} is trusted but is for "
        f"{', '.join(names) or 'no host name'}, not {host!r}: connect with a name the "
        f"certificate lists (bootstrap.servers, and the brokers' advertised.listeners)")


def _client_certificate_error(settings: Mapping[str, Any], address: str, text: str
                              ) -> ClientCertificateRejectedError:
    certificate = settings.get("ssl.certificate.location") or (
        "ssl.certificate.pem" if settings.get("ssl.certificate.pem") else None)
    if certificate is None:
        return ClientCertificateRejectedError(
            f"the broker at {address} requires a client certificate and none is configured: "
            f"set ssl.certificate.location and ssl.key.location ({_alert_of(text)})")
    return ClientCertificateRejectedError(
        f"the broker at {address} refused the client certificate {certificate} "
        f"({_alert_of(text)}): it must be signed by an authority in the brokers' "
        f"ssl.truststore, and be valid now")


def _protocol_mismatch(settings: Mapping[str, Any]) -> KafkaConnectionError | None:
    """A plaintext client at a TLS listener sees only "brokers are down": say so."""
    protocol = str(settings.get("security.protocol", "PLAINTEXT")).upper()
    if protocol.endswith("SSL"):
        return None
    for address in _addresses(str(settings.get("bootstrap.servers", ""))):
        host, port = _split(address)
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            _peer_certificate(context, host, port)
        except (OSError, ssl.SSLError):
            continue
        return KafkaUnreachableError(
            f"the broker at {address} speaks TLS and the client security.protocol is "
            f"{protocol}: set security.protocol to SSL or SASL_SSL (and ssl.ca.location)")
    return None


def _client_context(settings: Mapping[str, Any]) -> ssl.SSLContext:
    location = settings.get("ssl.ca.location")
    inline = settings.get("ssl.ca.pem")
    if location and location != "probe":
        if os.path.isdir(str(location)):
            return ssl.create_default_context(capath=str(location))
        return ssl.create_default_context(cafile=str(location))
    if inline:
        return ssl.create_default_context(cadata=str(inline))
    return ssl.create_default_context()


def _peer_certificate(context: ssl.SSLContext, host: str, port: int) -> dict[str, Any]:
    with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        return tls.getpeercert() or {}


def _trust_description(settings: Mapping[str, Any]) -> str:
    if settings.get("ssl.ca.location") and settings.get("ssl.ca.location") != "probe":
        return f"ssl.ca.location={settings['ssl.ca.location']}"
    if settings.get("ssl.ca.pem"):
        return "ssl.ca.pem"
    return "the system's authorities: no ssl.ca.location"


def _alert_of(text: str) -> str:
    for alert in _CLIENT_CERTIFICATE_ALERTS:
        if alert in text:
            return f"TLS {alert}"
    return text


def _address_in(text: str) -> str | None:
    # librdkafka prefixes its errors with "<protocol>://<host>:<port>/<id>: ".
    head = text.split(": ", 1)[0]
    if "://" not in head:
        return None
    address = head.split("://", 1)[1].rsplit("/", 1)[0]
    return address if ":" in address else None


def _addresses(servers: str) -> list[str]:
    return [s.strip().split("://")[-1] for s in servers.split(",") if s.strip()]


def _first(servers: str) -> str:
    found = _addresses(servers)
    return found[0] if found else servers


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _accepts_tcp(address: str) -> bool:
    try:
        host, port = _split(address)
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


__all__ = ["broker_certificate_error", "decisive_error", "unreachable_error"]
