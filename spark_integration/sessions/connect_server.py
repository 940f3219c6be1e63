"""A Spark Connect server with this library's Python and Spark's Kafka connector.

PySpark 4.2 ships the server (``pyspark/jars/spark-connect_2.13-<version>.jar``, on the
classpath of every ``spark-submit``). What a stateful query needs of it:

- its Python workers (the ``foreachBatch`` worker the server starts, the tasks'
  workers) run an interpreter with this library installed: ``spark.pyspark.python`` and
  ``PYSPARK_PYTHON``;
- Spark's Kafka connector for ``format("kafka")``: its jars in ``--jars``
  (:mod:`spark_integration.sessions.connector`);
- functions the client pickles by reference (e.g. ``examples.clickstream.update_user``)
  import on the server: their modules on its ``PYTHONPATH``.

:func:`server_command` gives the command line and :func:`server_environment` the
environment; ``python -m spark_integration.sessions.connect_server --port 15002`` runs a server in
the foreground (local master, loopback address) until it is stopped.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .connector import ensure_connector_jars
from .worker_daemon import WORKER_DAEMON

#: The server's main class (in PySpark's ``spark-connect`` jar).
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: The port Spark Connect listens on by default.
DEFAULT_PORT = 15002


@dataclass(frozen=True)
class ConnectServerConfig:
    """What a Spark Connect server runs with.

    Defaults: ``local[2]`` on ``127.0.0.1``, port 15002, this interpreter for the Python
    workers, Spark's Kafka connector on the classpath, the Spark UI off.
    """

    port: int = DEFAULT_PORT
    #: The address the gRPC service binds (loopback: only this machine's clients).
    host: str = "127.0.0.1"
    master: str = "local[2]"
    #: The Python workers' interpreter (one with this library installed).
    python: str = sys.executable
    #: Spark settings of the server's application (they win over the defaults above).
    spark_config: Mapping[str, str] = field(default_factory=dict)
    #: JVM options of the server (e.g. a tag recognisable in the process list).
    java_options: str = ""
    #: Directories prepended to the workers' ``PYTHONPATH`` (modules of pickled functions).
    python_path: Sequence[str] = ()

    @property
    def url(self) -> str:
        """The client's URL of this server (``sc://host:port``)."""
        return f"sc://{self.host}:{self.port}"


def spark_submit() -> Path:
    """The installed PySpark's ``spark-submit``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"


def server_command(config: ConnectServerConfig) -> list[str]:
    """The ``spark-submit`` command line of a Connect server (foreground; resolves the
    Kafka connector's jars once, see :func:`.connector.ensure_connector_jars`)."""
    jars = ",".join(str(path) for path in ensure_connector_jars())
    settings = {
        "spark.connect.grpc.binding.address": config.host,
        "spark.connect.grpc.binding.port": str(config.port),
        "spark.ui.enabled": "false",
        "spark.pyspark.python": config.python,
        "spark.python.daemon.module": WORKER_DAEMON,
        "spark.driver.host": config.host if config.master.startswith("local") else "",
        **config.spark_config,
    }
    command = [str(spark_submit()), "--class", SERVER_CLASS, "--name", "Spark Connect server",
               "--master", config.master, "--jars", jars]
    for key, value in settings.items():
        if value:
            command += ["--conf", f"{key}={value}"]
    if config.java_options:
        command += ["--driver-java-options", config.java_options]
    # The server's classes are on PySpark's classpath already: no application jar.
    return [*command, "spark-internal"]


def server_environment(config: ConnectServerConfig,
                       base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default: this process's) with the workers'
    Python and ``PYTHONPATH``, and, for a local master on loopback, ``SPARK_LOCAL_IP``."""
    env = dict(os.environ if base is None else base)
    env["PYSPARK_PYTHON"] = config.python
    env["PYSPARK_DRIVER_PYTHON"] = config.python
    if config.python_path:
        env["PYTHONPATH"] = os.pathsep.join(
            [*config.python_path, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    if config.master.startswith("local") and config.host.startswith("127."):
        env.setdefault("SPARK_LOCAL_IP", config.host)
    return env


def main(argv: list[str] | None = None) -> int:
    """Run a Connect server in the foreground (replaces this process)."""
    parser = argparse.ArgumentParser(
        prog="python -m spark_integration.sessions.connect_server",
        description="a Spark Connect server with kafka-changelog's Python and Spark's "
                    "Kafka connector")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting of the server (repeatable)")
    parser.add_argument("--python-path", action="append", default=[], metavar="DIR",
                        help="a directory for the workers' PYTHONPATH (repeatable)")
    args = parser.parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)
    config = ConnectServerConfig(port=args.port, host=args.host, master=args.master,
                                 spark_config=conf, python_path=tuple(args.python_path))
    command = server_command(config)
    print(f"Spark Connect server at {config.url}", flush=True)
    os.execve(command[0], command, server_environment(config))


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DEFAULT_PORT", "SERVER_CLASS", "ConnectServerConfig", "server_command",
           "server_environment", "spark_submit"]
