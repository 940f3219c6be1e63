"""Security given once: the librdkafka settings of :class:`StreamingStateConfig` as the
options of Spark's Kafka connector (Java client settings, ``kafka.``-prefixed) and of the
``kafka-changelog`` reader.

Our clients (the state's, the tasks' outputs through ``KafkaOutputSink``) are librdkafka;
Spark's ``format("kafka")`` source and sink are the Java client, which names the same
things differently: SASL credentials go in a JAAS line, trusted authorities and client
certificates in PEM trust and key stores. :func:`java_kafka_options` translates the
security settings (PEM files are read here and passed inline, so executors need no copy of
them); settings that only tune librdkafka are left out; a security setting it cannot
translate is refused by name (give the Java option yourself in ``java_overrides``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: The JAAS login module per SASL mechanism.
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka settings that tune our clients only (nothing the Java client must match).
_NOT_SECURITY = ("sasl.", "ssl.", "security.")


class KafkaOptionsError(ValueError):
    """A security setting has no translation to the Java client (named in the message)."""


def java_kafka_options(bootstrap_servers: str, client_config: Mapping[str, Any],
                       java_overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Options for ``spark.readStream.format("kafka")`` / ``write.format("kafka")``:
    ``kafka.bootstrap.servers`` and the security settings of ``client_config``
    (librdkafka names) as Java client settings, each ``kafka.``-prefixed;
    ``java_overrides`` (Java names, with or without the prefix) win.

    Raises :class:`KafkaOptionsError` naming a security setting (``sasl.*``, ``ssl.*``)
    that has no translation, unless ``java_overrides`` are given (then the Java side is
    the caller's: a warning names what was left out)."""
    settings = {str(k): v for k, v in client_config.items()}
    java: dict[str, str] = {"bootstrap.servers": bootstrap_servers}
    handled: set[str] = {"bootstrap.servers"}
    protocol = str(settings.get("security.protocol", "PLAINTEXT")).upper()
    java["security.protocol"] = protocol
    handled.add("security.protocol")
    if protocol.startswith("SASL"):
        java |= _sasl(settings)
        handled |= {"sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password"}
    if protocol.endswith("SSL"):
        java |= _tls(settings)
        handled |= {"ssl.ca.location", "ssl.ca.pem", "ssl.certificate.location",
                    "ssl.certificate.pem", "ssl.key.location", "ssl.key.pem",
                    "ssl.key.password", "ssl.endpoint.identification.algorithm",
                    "ssl.keystore.location", "ssl.keystore.password"}
    overrides = {k.removeprefix("kafka."): str(v) for k, v in (java_overrides or {}).items()}
    untranslated = sorted(k for k in settings if k.startswith(_NOT_SECURITY)
                          and k not in handled)
    if untranslated and overrides:
        logger.warning("the librdkafka setting(s) %s have no Java translation: Spark's Kafka "
                       "connector goes with the java_overrides given", ", ".join(untranslated))
    elif untranslated:
        raise KafkaOptionsError(
            f"no Java client translation for the librdkafka setting(s) "
            f"{', '.join(untranslated)}: give the Java settings for Spark's Kafka connector "
            f"in java_overrides (e.g. {{'sasl.jaas.config': '...'}})")
    java |= overrides
    return {f"kafka.{k}": v for k, v in java.items()}


def reader_options(bootstrap_servers: str, client_config: Mapping[str, Any]
                   ) -> dict[str, str]:
    """Options for ``spark.read.format("kafka-changelog")``: the brokers and every
    librdkafka setting, ``kafka.``-prefixed (the reader is librdkafka too)."""
    options = {"kafka.bootstrap.servers": bootstrap_servers}
    options |= {f"kafka.{k}": str(v) for k, v in client_config.items()
                if not callable(v)}
    return options


def _sasl(settings: Mapping[str, Any]) -> dict[str, str]:
    mechanism = str(settings.get("sasl.mechanism", settings.get("sasl.mechanisms", "GSSAPI")))
    module = _LOGIN_MODULES.get(mechanism.upper())
    if module is None:
        raise KafkaOptionsError(
            f"no Java client translation for sasl.mechanism={mechanism}: give "
            f"sasl.jaas.config (and the mechanism's settings) in java_overrides")
    user, password = settings.get("sasl.username"), settings.get("sasl.password")
    if user is None or password is None:
        raise KafkaOptionsError(f"sasl.mechanism={mechanism} needs sasl.username and "
                                f"sasl.password in client_config")
    return {"sasl.mechanism": mechanism.upper(),
            "sasl.jaas.config": (f"{module} required username={_jaas_quoted(str(user))} "
                                 f"password={_jaas_quoted(str(password))};")}


def _tls(settings: Mapping[str, Any]) -> dict[str, str]:
    java: dict[str, str] = {}
    authorities = _pem(settings, "ssl.ca.pem", "ssl.ca.location")
    if authorities is not None:
        java |= {"ssl.truststore.type": "PEM", "ssl.truststore.certificates": authorities}
    chain = _pem(settings, "ssl.certificate.pem", "ssl.certificate.location")
    key = _pem(settings, "ssl.key.pem", "ssl.key.location")
    if (chain is None) != (key is None):
        raise KafkaOptionsError("a client certificate needs both ssl.certificate.location "
                                "(or .pem) and ssl.key.location (or .pem)")
    if chain is not None and key is not None:
        java |= {"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": chain,
                 "ssl.keystore.key": key}
        if settings.get("ssl.key.password"):
            java["ssl.key.password"] = str(settings["ssl.key.password"])
    elif settings.get("ssl.keystore.location"):
        java |= {"ssl.keystore.type": "PKCS12",
                 "ssl.keystore.location": str(settings["ssl.keystore.location"])}
        if settings.get("ssl.keystore.password"):
            java["ssl.keystore.password"] = str(settings["ssl.keystore.password"])
    algorithm = str(settings.get("ssl.endpoint.identification.algorithm", "https")).lower()
    java["ssl.endpoint.identification.algorithm"] = "" if algorithm == "none" else algorithm
    return java


def _pem(settings: Mapping[str, Any], inline: str, location: str) -> str | None:
    if settings.get(inline):
        return str(settings[inline])
    path = settings.get(location)
    if not path or path == "probe":
        return None  # the system's authorities: the JVM's default trust store
    try:
        return Path(str(path)).read_text("ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise KafkaOptionsError(f"cannot read {location}={path}: {exc}") from exc


def _jaas_quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


__all__ = ["KafkaOptionsError", "java_kafka_options", "reader_options"]
