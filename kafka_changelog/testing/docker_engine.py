"""A Docker engine for the container tests: installed, started and stopped on demand.

:func:`acquire_engine` returns a :class:`DockerEngine` that answers: the one named by
``DOCKER_HOST`` or listening on the default socket if there is one, else a ``dockerd``
started here (as root only) with its own data root (:data:`DATA_ROOT`), its own socket,
and no bridge, NAT or iptables rules: containers of the tests use the host's network and
bind 127.0.0.1 only. Debian's ``docker.io`` package is installed with ``apt-get`` first if
``dockerd`` is missing.

Invariants:

* Only an engine started here is ever stopped here, and only by the last user: every
  process using it holds a shared lock on :data:`USERS_LOCK` until :meth:`DockerEngine.release`;
  the one that then gets the lock exclusively stops ``dockerd`` (by the pid it recorded).
* Starting is serialized by an exclusive lock, so parallel test workers start one engine.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from kafka_changelog.local_kafka.errors import DockerUnavailableError

DATA_ROOT = Path("/var/lib/kafka-changelog-docker")
"""Images, containers and volumes of the engine started here (not the system's engine's)."""
RUN_DIR = Path("/run/kafka-changelog-docker")
"""Socket, pid file, exec root and locks of the engine started here."""
SOCKET = RUN_DIR / "docker.sock"
PID_FILE = RUN_DIR / "dockerd.pid"
START_LOCK = RUN_DIR / "start.lock"
USERS_LOCK = RUN_DIR / "users.lock"
LOG_FILE = RUN_DIR / "dockerd.log"
DEFAULT_SOCKET = Path("/var/run/docker.sock")
START_TIMEOUT_S = 60.0

#: dockerd flags: no bridge, no NAT, no firewall rules; containers run with --network host.
DOCKERD_FLAGS: tuple[str, ...] = (
    "--bridge=none",
    "--iptables=false",
    "--ip6tables=false",
    "--ip-forward=false",
    "--ip-masq=false",
    "--userland-proxy=false",
)


@dataclass
class DockerEngine:
    """A Docker engine that answers at ``host`` (a ``DOCKER_HOST`` URL).

    ``started_here``: this module started ``dockerd`` (and may stop it on release).
    """

    host: str
    started_here: bool = False
    _users_lock: IO[bytes] | None = field(default=None, repr=False)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The process environment with ``DOCKER_HOST`` pointing at this engine."""
        env = dict(os.environ)
        env["DOCKER_HOST"] = self.host
        env.update(extra or {})
        return env

    def docker(
        self, *args: str, check: bool = True, timeout: float = 600.0, input: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the ``docker`` CLI against this engine and return its output.

        Raises:
            DockerUnavailableError: with ``check``, the command failed (its stderr quoted).
        """
        result = subprocess.run(
            [docker_cli(), *args], env=self.env(), capture_output=True, timeout=timeout,
            input=input, check=False,
        )
        completed = subprocess.CompletedProcess(
            result.args, result.returncode,
            result.stdout.decode("utf-8", "replace"), result.stderr.decode("utf-8", "replace"),
        )
        if check and completed.returncode != 0:
            raise DockerUnavailableError(
                f"docker {' '.join(args[:3])} failed (exit {completed.returncode}): "
                f"{completed.stderr.strip()[-2000:]}"
            )
        return completed

    def release(self) -> None:
        """Stop using the engine; the last user of an engine started here stops it."""
        lock, self._users_lock = self._users_lock, None
        if lock is None:
            return
        fcntl.flock(lock, fcntl.LOCK_UN)
        if not self.started_here:
            lock.close()
            return
        with locked(START_LOCK):
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                return  # another process still uses it
            try:
                _stop_dockerd()
            finally:
                lock.close()


def docker_cli() -> str:
    """The ``docker`` client executable.

    Raises:
        DockerUnavailableError: none is installed.
    """
    cli = shutil.which("docker")
    if cli is None:
        raise DockerUnavailableError(
            "the docker client is not installed (apt-get install docker.io)")
    return cli


def is_root() -> bool:
    """Whether this process may install packages and start ``dockerd``."""
    return os.geteuid() == 0


def install_docker() -> None:
    """Install Debian's ``docker.io`` with ``apt-get`` if ``dockerd`` is missing.

    Raises:
        DockerUnavailableError: not root, no ``apt-get``, or the installation failed.
    """
    if shutil.which("dockerd") and shutil.which("docker"):
        return
    if not is_root():
        raise DockerUnavailableError(
            "Docker is not installed and this is not root: install it with "
            "'sudo apt-get install docker.io' (or run the tests as root), or use the "
            "local-process broker (pytest --broker=local, the default)"
        )
    if shutil.which("apt-get") is None:
        raise DockerUnavailableError(
            "Docker is not installed and there is no apt-get to install it")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "docker.io"]):
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise DockerUnavailableError(
                f"{' '.join(argv)} failed (exit {result.returncode}): {result.stderr[-2000:]}"
            )


def _answers(host: str) -> bool:
    try:
        result = subprocess.run(
            [docker_cli(), "version", "--format", "{{.Server.Version}}"],
            env=dict(os.environ, DOCKER_HOST=host), capture_output=True, timeout=15, check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


@contextlib.contextmanager
def locked(path: Path) -> Iterator[IO[bytes]]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def acquire_engine(*, install: bool = True) -> DockerEngine:
    """A Docker engine that answers, installing and starting one if needed.

    Call :meth:`DockerEngine.release` when done (a pytest session fixture does).

    Raises:
        DockerUnavailableError: Docker is missing and cannot be installed, or ``dockerd``
            cannot be started (not root, or it failed: the tail of its log is quoted).
    """
    explicit = os.environ.get("DOCKER_HOST")
    if explicit:
        docker_cli()
        if not _answers(explicit):
            raise DockerUnavailableError(f"DOCKER_HOST={explicit} does not answer")
        return DockerEngine(explicit)
    if install:
        install_docker()
    docker_cli()
    ours = f"unix://{SOCKET}"
    if not is_root():
        if DEFAULT_SOCKET.exists() and _answers(f"unix://{DEFAULT_SOCKET}"):
            return DockerEngine(f"unix://{DEFAULT_SOCKET}")
        raise DockerUnavailableError(
            "no Docker engine answers and only root may start one here: start dockerd "
            "(sudo systemctl start docker) or use the local-process broker (--broker=local)"
        )
    with locked(START_LOCK):
        users = USERS_LOCK.open("ab")
        fcntl.flock(users, fcntl.LOCK_SH)
        if SOCKET.exists() and _answers(ours):
            return DockerEngine(ours, started_here=True, _users_lock=users)
        if DEFAULT_SOCKET.exists() and _answers(f"unix://{DEFAULT_SOCKET}"):
            users.close()
            return DockerEngine(f"unix://{DEFAULT_SOCKET}")
        try:
            _start_dockerd()
        except BaseException:
            users.close()
            raise
        return DockerEngine(ours, started_here=True, _users_lock=users)


def _start_dockerd() -> None:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise DockerUnavailableError("dockerd is not installed (apt-get install docker.io)")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    argv: Sequence[str] = (
        dockerd, f"--data-root={DATA_ROOT}", f"--exec-root={RUN_DIR / 'exec'}",
        f"--pidfile={PID_FILE}", f"--host=unix://{SOCKET}", *DOCKERD_FLAGS,
    )
    with LOG_FILE.open("ab") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # not killed with the test's process group
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DockerUnavailableError(
                f"dockerd exited with {process.returncode}:\n{_log_tail()}")
        if SOCKET.exists() and _answers(f"unix://{SOCKET}"):
            return
        time.sleep(0.3)
    process.kill()
    raise DockerUnavailableError(
        f"dockerd did not answer within {START_TIMEOUT_S}s:\n{_log_tail()}")


def _stop_dockerd(timeout: float = 30.0) -> None:
    """Stop the ``dockerd`` of :data:`PID_FILE` (SIGTERM, then SIGKILL) and wait for it."""
    try:
        pid = int(PID_FILE.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (ours, not yet reaped) is dead too.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return False
    return True


def _log_tail(lines: int = 30) -> str:
    try:
        return "\n".join(LOG_FILE.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no dockerd log)"
