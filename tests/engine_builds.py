"""What the engine tests (Slurm, the work queue) share: the cells they build (a one-kernel
torch extension, conftest.write_tiny_cuda_ext with torch's headers: one object of about a
minute, long enough to cancel or kill a build mid-compile, a quarter of the bundled example's
work: these tests are about engines, leases and publishing, not compiling), one persistent work
dir for both (a cell built by one test is a resumed tree in the next), and the checks on what
they published."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from conftest import cache_root, write_example_matrix, write_tiny_cuda_ext
from index_fixtures import installer_env

from factory.store import open_store

# Slurm: 4 cells; the queue: 6, the same 4 and two more
ARCHS_SLURM = ("8.0", "9.0", "10.0", "12.0")
ARCHS_QUEUE = (*ARCHS_SLURM, "8.6", "8.9")
# each cell's import check installs torch into a clean venv (~3 min here): the real verify's
# other checks (archs in the binary, tags, metadata) still run
BUILD_ARGS = ("--no-import-check",)


PACKAGE = "tiny-cuda-ext"


def engine_work_dir() -> Path:
    return cache_root() / "work-engines"


def engine_matrix(path: Path, archs: tuple[str, ...]) -> Path:
    source = write_tiny_cuda_ext(cache_root() / "engine-ext", torch_headers=True)
    return write_example_matrix(path, work_dir=engine_work_dir(), archs=archs, runner="local",
                                package=PACKAGE, source=source)


def cell_ids(archs: Iterable[str]) -> list[str]:
    return [f"{PACKAGE}-0.1.0-torch2.14.1-cu130-sm{a.replace('.', '')}-cp311" for a in archs]


# every line of a cell's build in CI starts with its short id: "[PKG@VARIANT-cpXY] "
PREFIX = r"^(?:\[[^\]\s]+@[^\]\s]+\] )?"


def built_counts(logs: Iterable[str]) -> Counter[str]:
    """How often each cell was built to the end (its ``cell ID`` step followed by a ``publish``
    step), over all the logs: a cell skipped as published, or killed mid-build, does not
    count. (Not the store: a rebuilt cell is reproducible, its second publish a no-op.)"""
    out: Counter[str] = Counter()
    for text in logs:
        cell = None
        for line in text.splitlines():
            if m := re.match(PREFIX + r"\[\s*[\d.]+s\] cell (\S+)$", line):
                cell = m.group(1)
            elif cell and re.match(PREFIX + r"\[\s*[\d.]+s\] publish to ", line):
                out[cell] += 1
                cell = None
    return out


def wheel_version(arch: str) -> str:
    return f"0.1.0+cu130torch2.14sm{arch.replace('.', '')}"


def published_versions(spec: str) -> Counter[str]:
    """version -> how many wheels of it the store has (one per cell: its arch is in it)."""
    return Counter(w.version for w in open_store(spec).wheels())


def assert_installable(spec: str, tmp: Path, versions: Iterable[str]) -> None:
    """pip (no config, no index of this machine) installs each version by name from the
    project's page as the store holds it: the page and every file it links to are copied out
    of the store keeping their keys, and pip follows the page's relative links to them."""
    store = open_store(spec)
    tree = tmp / "store-copy"
    page_key = f"simple/{PACKAGE}/index.html"
    keys = [page_key, *(o.key for o in store.list("files/", sizes=False))]
    for key, data in zip(keys, store.read_many(keys), strict=True):
        assert data is not None, key
        (tree / key).parent.mkdir(parents=True, exist_ok=True)
        (tree / key).write_bytes(data)
    page = (tree / page_key).as_uri()
    for n, version in enumerate(versions):
        target = tmp / f"site-{n}"
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
             str(target), "--find-links", page, f"{PACKAGE}=={version}"],
            env=installer_env(tmp), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert any(target.glob("tiny_cuda_ext/_C*.so")), os.listdir(target)
