"""Certificates for the local cluster's TLS listeners, made at start with ``openssl``.

A cluster with TLS gets a certificate authority of its own (valid for two days), a broker
certificate it signs for every name clients use (``127.0.0.1``, ``localhost`` and the
advertised host), and a client certificate per user whose subject is ``CN=<user>`` (the
broker maps it to the principal ``User:<user>``). Keys are EC P-256 in unencrypted PKCS#8
PEM: what both librdkafka and Kafka's PEM key stores read. Tests make a second,
unrelated authority with :meth:`CertificateAuthority.create` to check that a client or a
broker trusting only that one is refused.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kafka_changelog.local_kafka.errors import KafkaHarnessError, ToolMissingError

#: The subject common name of the brokers' certificate (and their principal between them).
BROKER_COMMON_NAME = "kafka-broker"
_VALID_DAYS = "2"
_KEY_OPTIONS = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")


@dataclass(frozen=True)
class Certificate:
    """A certificate and its private key, as PEM files."""

    certificate: Path
    key: Path

    def keystore(self, authority: CertificateAuthority) -> Path:
        """One PEM file with the key, the certificate and the authority's certificate (a
        Kafka ``PEM`` key store; written next to the certificate on first use)."""
        path = self.certificate.with_suffix(".keystore.pem")
        if not path.exists():
            path.write_text(self.key.read_text() + self.certificate.read_text()
                            + authority.certificate.read_text())
        return path


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed authority in ``directory`` that issues certificates there."""

    directory: Path
    certificate: Path
    key: Path

    @staticmethod
    def create(directory: Path, name: str = "kafka-changelog local test CA"
               ) -> CertificateAuthority:
        """A new authority (``directory/ca.pem`` and ``ca.key``)."""
        directory.mkdir(parents=True, exist_ok=True)
        certificate, key = directory / "ca.pem", directory / "ca.key"
        _openssl("req", "-x509", *_KEY_OPTIONS, "-keyout", str(key), "-out", str(certificate),
                 "-days", _VALID_DAYS, "-subj", f"/CN={name}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return CertificateAuthority(directory, certificate, key)

    def issue(self, common_name: str, hosts: Iterable[str] = ()) -> Certificate:
        """A certificate for ``CN=<common_name>``, usable by servers (valid for ``hosts``:
        names and IP addresses) and by clients."""
        stem = self.directory / _file_name(common_name)
        certificate, key = stem.with_suffix(".pem"), stem.with_suffix(".key")
        request = stem.with_suffix(".csr")
        extensions = stem.with_suffix(".ext")
        names = [f"IP:{h}" if _is_address(h) else f"DNS:{h}" for h in dict.fromkeys(hosts)]
        lines = ["basicConstraints=CA:FALSE", "extendedKeyUsage=serverAuth,clientAuth"]
        if names:
            lines.append("subjectAltName=" + ",".join(names))
        extensions.write_text("\n".join(lines) + "\n")
        _openssl("req", "-new", *_KEY_OPTIONS, "-keyout", str(key), "-out", str(request),
                 "-subj", f"/CN={common_name}")
        _openssl("x509", "-req", "-in", str(request), "-CA", str(self.certificate),
                 "-CAkey", str(self.key), "-set_serial", str(uuid.uuid4().int >> 64),
                 "-days", _VALID_DAYS, "-extfile", str(extensions), "-out", str(certificate))
        request.unlink()
        extensions.unlink()
        return Certificate(certificate, key)


@dataclass(frozen=True)
class TlsFiles:
    """What a TLS-enabled local cluster was started with."""

    authority: CertificateAuthority
    #: The brokers' certificate (for every host name clients use).
    broker: Certificate
    #: A client certificate per user name.
    clients: Mapping[str, Certificate] = field(default_factory=dict)

    @staticmethod
    def create(directory: Path, users: Iterable[str], hosts: Iterable[str]) -> TlsFiles:
        """A new authority in ``directory``, the brokers' certificate for ``hosts`` and a
        client certificate per user."""
        authority = CertificateAuthority.create(directory)
        broker = authority.issue(BROKER_COMMON_NAME, hosts)
        clients = {user: authority.issue(user) for user in users}
        return TlsFiles(authority, broker, clients)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name) or "_"


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ToolMissingError("openssl is needed to make the local cluster's TLS "
                               "certificates (Debian: apt-get install openssl)")
    done = subprocess.run([openssl, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KafkaHarnessError(f"openssl {args[0]} failed ({done.returncode}): "
                           f"{done.stderr.strip()}")


__all__ = ["BROKER_COMMON_NAME", "Certificate", "CertificateAuthority", "TlsFiles"]
