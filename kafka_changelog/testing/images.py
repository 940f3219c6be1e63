"""The project's Docker images, built here from Debian packages and Maven Central jars.

No image registry is needed: :func:`ensure_base_image` makes a Debian root file system
with ``debootstrap`` and imports it (tag :data:`BASE_IMAGE`, the name the Dockerfiles'
``FROM`` uses); :func:`ensure_kafka_image` builds :data:`KAFKA_IMAGE` from it with a
Debian JRE and the Kafka jars of :func:`~kafka_changelog.local_kafka.jars.ensure_kafka_jars`.
That image stands in for ``apache/kafka`` under the same ``KAFKA_*`` settings.

Invariant: an image is built only when no image carries the label :data:`INPUTS_LABEL`
with the hash of its inputs (debootstrap suite and mirror; Dockerfile, scripts, jars and
base image id), so a second call with unchanged inputs builds nothing.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from kafka_changelog.local_kafka.errors import DockerUnavailableError
from kafka_changelog.local_kafka.jars import KAFKA_VERSION, ensure_kafka_jars
from kafka_changelog.local_kafka.maven import cache_root
from kafka_changelog.testing.docker_engine import DockerEngine, docker_cli, locked

BASE_IMAGE = "kafka-changelog/debian:bookworm"
KAFKA_IMAGE = f"kafka-changelog/kafka:{KAFKA_VERSION}"
INPUTS_LABEL = "org.kafka-changelog.inputs"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: Packages of the base image beyond debootstrap's minbase.
BASE_PACKAGES: tuple[str, ...] = ("ca-certificates", "procps")
_BASE_RECIPE_VERSION = "1"


def docker_cache_dir() -> Path:
    """Where root file systems are made (outside the work tree)."""
    return cache_root() / "docker"


def image_with_inputs(engine: DockerEngine, tag: str, digest: str) -> str | None:
    """The id of image ``tag`` if it was built from inputs hashing to ``digest``."""
    result = engine.docker(
        "image", "inspect", "--format",
        f'{{{{.Id}}}} {{{{index .Config.Labels "{INPUTS_LABEL}"}}}}', tag, check=False,
    )
    if result.returncode != 0:
        return None
    image_id, _, label = result.stdout.strip().partition(" ")
    return image_id if label == digest else None


def base_inputs_digest() -> str:
    """Hash of everything the base image is made from."""
    text = "\n".join((_BASE_RECIPE_VERSION, DEBIAN_SUITE, DEBIAN_MIRROR, *BASE_PACKAGES))
    return hashlib.sha256(text.encode()).hexdigest()


def ensure_base_image(engine: DockerEngine) -> str:
    """:data:`BASE_IMAGE` (Debian minbase via ``debootstrap``), built once; its image id.

    Raises:
        DockerUnavailableError: ``debootstrap`` is missing (and not installable) or failed.
    """
    digest = base_inputs_digest()
    found = image_with_inputs(engine, BASE_IMAGE, digest)
    if found:
        return found
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(debootstrap).exists():
        _apt_install("debootstrap")
    docker_cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=docker_cache_dir(), prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run([debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
              DEBIAN_SUITE, str(rootfs), DEBIAN_MIRROR], "debootstrap")
        # Cached package files are not part of an image.
        for leftover in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            leftover.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        result = subprocess.run(
            [docker_cli(), "import", "--change", f"LABEL {INPUTS_LABEL}={digest}",
             "--change", 'CMD ["bash"]', "-", BASE_IMAGE],
            stdin=tar.stdout, env=engine.env(), capture_output=True, text=True, check=False,
        )
        tar.stdout.close()
        tar.wait()
        if result.returncode != 0 or tar.returncode != 0:
            raise DockerUnavailableError(f"docker import of {BASE_IMAGE} failed: {result.stderr}")
    found = image_with_inputs(engine, BASE_IMAGE, digest)
    if not found:
        raise DockerUnavailableError(f"{BASE_IMAGE} is missing right after its import")
    return found


def _kafka_context_files() -> dict[str, bytes]:
    folder = resources.files(__package__).joinpath("kafka_image")
    return {name: folder.joinpath(name).read_bytes()
            for name in ("Dockerfile", "kafka-run", "log4j2.properties")}


def kafka_inputs_digest(base_id: str, jars_dir: Path) -> str:
    """Hash of the Kafka image's inputs: base image, context files and every jar's bytes."""
    digest = hashlib.sha256(base_id.encode())
    for name, data in sorted(_kafka_context_files().items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    for jar in sorted(jars_dir.glob("*.jar")):
        digest.update(jar.name.encode() + b"\0" + hashlib.sha256(jar.read_bytes()).digest())
    return digest.hexdigest()


def ensure_kafka_image(engine: DockerEngine, version: str = KAFKA_VERSION) -> str:
    """:data:`KAFKA_IMAGE` built on the base image (itself built if needed); returns its tag.

    Processes building at once (parallel test workers) take turns: the later ones find
    the images the first built.

    Raises:
        DockerUnavailableError: a build failed (the build's output is quoted).
    """
    if version != KAFKA_VERSION:
        raise ValueError(f"only Kafka {KAFKA_VERSION} has a local image recipe, not {version}")
    with locked(docker_cache_dir() / "build.lock"):
        return _ensure_kafka_image(engine, version)


def _ensure_kafka_image(engine: DockerEngine, version: str) -> str:
    base_id = ensure_base_image(engine)
    jars_dir = ensure_kafka_jars(version)
    digest = kafka_inputs_digest(base_id, jars_dir)
    if image_with_inputs(engine, KAFKA_IMAGE, digest):
        return KAFKA_IMAGE
    with tempfile.TemporaryDirectory(prefix="kafka-image-") as tmp:
        context = Path(tmp)
        for name, data in _kafka_context_files().items():
            (context / name).write_bytes(data)
        (context / "kafka-run").chmod(0o755)
        libs = context / "libs"
        libs.mkdir()
        for jar in jars_dir.glob("*.jar"):
            shutil.copy2(jar, libs / jar.name)
        engine.docker("build", "--force-rm", "--network", "host",
                      "--build-arg", f"BASE={BASE_IMAGE}",
                      "--label", f"{INPUTS_LABEL}={digest}", "-t", KAFKA_IMAGE, str(context),
                      timeout=1800)
    prune_dangling_images(engine)
    return KAFKA_IMAGE


def prune_dangling_images(engine: DockerEngine) -> None:
    """Delete untagged images (those a rebuild replaced). Builds run with ``--force-rm``, so
    they leave no containers; stopped containers are not pruned: a test may have stopped
    its broker to start it again (another test, on another worker, shares the engine)."""
    engine.docker("image", "prune", "-f", check=False)


def _apt_install(package: str) -> None:
    _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
         f"apt-get install {package}")


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DockerUnavailableError(
            f"{what} failed (exit {result.returncode}): {(result.stderr or result.stdout)[-2000:]}"
        )


def main() -> int:
    """Build (or find) the images; print the Kafka image's tag. Stops a dockerd it started."""
    from kafka_changelog.testing.docker_engine import acquire_engine

    engine = acquire_engine()
    try:
        print(ensure_kafka_image(engine))
    finally:
        engine.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
