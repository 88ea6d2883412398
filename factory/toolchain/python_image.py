"""Builder images per Python version.

``factory-base:<suite>`` is a Debian release as debootstrap makes it (factory.toolchain.images),
with that release's one Python: bookworm 3.11, trixie 3.13. ``factory-base:<suite>-py<X.Y>`` adds a
second CPython, built from Debian's own source package of it, to the same release.

Why the second form: the compile cache keys nvcc's work on the preprocessed source, which holds
the host compiler's and libc's headers. A cp313 build on trixie (g++ 14, glibc 2.41) shares only
ptxas results with a cp311 build on bookworm (g++ 12, glibc 2.36); on bookworm-py3.13 it shares
every kernel object. It also keeps every Python's wheels on one manylinux tag.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

from factory.engine import docker_client
from factory.errors import EngineError, ToolchainError
from factory.toolchain.images import (
    DEBIAN_MIRROR,
    DEFAULT_WORK_DIR,
    ensure_base_image,
    image_label,
    image_progress,
    image_state,
)

_log = logging.getLogger(__name__)

# The CPython a ``-py<X.Y>`` image was given (build_python_image): an image of that name
# without it (say, a plain base image imported under the name) is made again, not trusted.
PYTHON_LABEL = "org.factory.python"
IMAGE_RE = re.compile(r"^factory-base:(?P<suite>[a-z]+)(?:-py(?P<python>3\.\d+))?$")
# Which Debian release ships the source package of each CPython (``python3.X``).
SOURCE_SUITES = {"3.11": "bookworm", "3.13": "trixie"}
# The one Python each Debian release ships (a ``factory-base:<suite>`` image's python3).
SUITE_PYTHONS = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}
# Run in the base image, as root, with the network on (only this image build has it): the
# release's build deps, the source from Debian's archive, a plain (no PGO) build, altinstall so
# python3 stays the release's own interpreter.
BUILD_SCRIPT = r"""set -eu
echo "deb-src {mirror} {source_suite} main" \
    > /etc/apt/sources.list.d/python-source.list
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends xz-utils \
    libssl-dev zlib1g-dev libbz2-dev libreadline-dev libsqlite3-dev libffi-dev liblzma-dev \
    uuid-dev libgdbm-dev libncurses-dev pkgconf
mkdir -p /tmp/pysrc && cd /tmp/pysrc
apt-get source --download-only python{python}
# bookworm ships .orig.tar.gz, trixie .orig.tar.xz with its signature (.asc) beside it
orig=$(ls python{python}_*.orig.tar.gz python{python}_*.orig.tar.xz 2>/dev/null | head -n 1)
tar xf "$orig"
cd Python-{python}*/
./configure --prefix=/usr/local --with-ensurepip=install > /tmp/pysrc/configure.log
make -j"$(nproc)" > /tmp/pysrc/make.log 2>&1 || {{ tail -n 40 /tmp/pysrc/make.log; exit 1; }}
make altinstall > /tmp/pysrc/install.log 2>&1 || {{ tail -n 40 /tmp/pysrc/install.log; exit 1; }}
/usr/local/bin/python{python} -c 'import ssl, sqlite3, ctypes, venv, zlib, bz2, lzma'
rm -rf /tmp/pysrc /var/lib/apt/lists/* /etc/apt/sources.list.d/python-source.list
"""


def parse_image(name: str) -> tuple[str, str | None]:
    """'factory-base:bookworm-py3.13' -> ('bookworm', '3.13');
    'factory-base:trixie' -> ('trixie', None)."""
    m = IMAGE_RE.match(name)
    if not m:
        raise EngineError(
            f"builder image {name} is not one the factory can make",
            tip="names it makes: factory-base:<debian suite>[-py<X.Y>]",
        )
    return m.group("suite"), m.group("python")


def image_pythons(name: str) -> frozenset[str] | None:
    """The Pythons a builder image the factory makes has ('factory-base:bookworm-py3.13' ->
    {'3.11', '3.13'}); None for any other image (only running it tells)."""
    m = IMAGE_RE.match(name)
    if not m or m.group("suite") not in SUITE_PYTHONS:
        return None
    return frozenset(p for p in (SUITE_PYTHONS[m.group("suite")], m.group("python")) if p)


def lacks_python(image: str, python: str) -> str | None:
    """Why ``image`` cannot build cells of ``python`` as far as its name tells ('has Python
    3.11, not 3.12'), else None."""
    pythons = image_pythons(image)
    if pythons is None or python in pythons:
        return None
    return f"has Python {', '.join(sorted(pythons))}, not {python}"


def base_for_python(base_image: str, python: str) -> str | None:
    """An image the factory can make that has ``python``, on ``base_image``'s Debian release
    ('factory-base:bookworm', '3.13' -> 'factory-base:bookworm-py3.13'); None when it cannot."""
    m = IMAGE_RE.match(base_image)
    if not m or python not in SOURCE_SUITES:
        return None
    if python == SUITE_PYTHONS.get(m.group("suite")):
        return f"factory-base:{m.group('suite')}"
    return f"factory-base:{m.group('suite')}-py{python}"


def check_image_python(image: str, python: str, *, run_image: bool = True) -> None:
    """Raise ToolchainError when ``image`` has no ``python{X.Y}``: builds run that interpreter,
    so an image without it cannot build the cell's Python. What its name tells is checked
    first; any other image is run (it must exist) unless ``run_image`` is False."""
    lacks = lacks_python(image, python)
    reason = f"{image} {lacks}" if lacks else None
    if reason is None and run_image and image_pythons(image) is None:
        # heavy: the docker SDK, imported when used
        from docker.errors import APIError, ContainerError

        try:
            docker_client().containers.run(
                image, ["sh", "-c", f"exec python{python} -c pass"], remove=True,
                network_disabled=True,
            )
        except ContainerError:
            reason = f"{image} has no python{python}"
        except APIError as exc:
            raise EngineError(f"cannot run image {image}: {exc}") from None
    if reason:
        raise ToolchainError(
            f"{reason}: an image on it could not build cp{python.replace('.', '')} cells",
            tip=f"pass --base an image with python{python}, or name one in [settings.images] "
            f'("{python}" = "IMAGE")',
        )


def ensure_builder_image(name: str, *, work_dir: Path = DEFAULT_WORK_DIR) -> str:
    """Make sure ``name`` exists; make it (debootstrap, then a CPython build) when it does not.
    A ``factory-base:<suite>-py<X.Y>`` image counts only with its CPython's label."""
    client = docker_client()
    state = image_state(client, name)
    match = IMAGE_RE.match(name)
    python = match.group("python") if match else None
    if state == "current" and (python is None or image_label(client, name, PYTHON_LABEL) == python):
        return name
    if not match:
        # any other name: an image of the user's is used as it is; a missing one is made as the
        # default base, as before
        return name if state == "stale" else ensure_base_image(name, work_dir=work_dir)
    suite = match.group("suite")
    base = ensure_base_image(f"factory-base:{suite}", suite=suite, work_dir=work_dir)
    if python is None:
        return base
    if state != "missing":
        _log.info(f"+ image {name} has no CPython {python} of the factory's: making it again")
    return build_python_image(base, name, python=python)


def build_python_image(base: str, name: str, *, python: str) -> str:
    """Build CPython ``python`` from Debian's source into ``base`` and commit it as ``name``."""
    source_suite = SOURCE_SUITES.get(python)
    if source_suite is None:
        known = ", ".join(sorted(SOURCE_SUITES))
        raise EngineError(f"no Debian source package known for Python {python} (known: {known})")
    # heavy: the docker SDK, imported when used
    from docker.errors import APIError, ContainerError

    client = docker_client()

    mirror = os.environ.get("DEBIAN_MIRROR", DEBIAN_MIRROR)  # as the base image's debootstrap
    script = BUILD_SCRIPT.format(mirror=mirror, source_suite=source_suite, python=python)
    _log.info(f"+ build CPython {python} (Debian {source_suite} source) into {base} -> {name}")
    start = time.monotonic()
    container = client.containers.create(base, ["bash", "-c", script], user="0:0")
    try:
        container.start()
        with image_progress(f"building CPython {python}", container):
            # minutes of compiling; the client default is 120 s
            status = container.wait(timeout=3 * 3600)
        if int(status.get("StatusCode", 1)) != 0:
            lines = [x.strip() for x in container.logs(tail=40).decode(errors="replace")
                     .splitlines() if x.strip()]
            raise EngineError(f"building CPython {python} for {name} failed",
                              tip="its last lines: " + " / ".join(lines[-3:]))
        repo, _, tag = name.rpartition(":")
        container.commit(repository=repo, tag=tag,
                         changes=['CMD ["/bin/bash"]', f"LABEL {PYTHON_LABEL}={python}"])
    except (APIError, ContainerError) as exc:
        raise EngineError(f"building image {name} failed: {exc}") from None
    finally:
        container.remove(force=True)
    _log.info(f"  built in {time.monotonic() - start:.0f} s")
    return name
