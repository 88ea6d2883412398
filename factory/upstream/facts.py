"""The facts the matrix is resolved and checked against, each with where it came from.

- ``TorchRelease``: a torch version on PyPI, with the CPythons and CPUs of its Linux wheels.
- ``TorchBuild``: one CUDA build of one torch version: PyPI's own (``index`` None; its CUDA read
  from the wheels' requirements) or one on PyTorch's per-CUDA index (``index`` its URL), with
  its wheels per CPU and Python. A build that could not be read from any index is kept only as
  ``declared`` (its origin names the document it comes from) and is shown as such.
- ``PackageRelease``: a package version on PyPI with its sdist and the sdist's sha256.

Where a ``Facts`` object comes from, in the order ``load_facts`` tries them: the cache that
``factory lock`` (or ``factory facts refresh``) writes under the work dir, else the snapshot
shipped in ``factory/data/`` (regenerated from recorded responses by ``factory facts
snapshot``, never edited by hand).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import importlib.resources
import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from factory.environment import FACTS_ENV, env_value
from factory.errors import ConfigError

# The oldest torch the facts cover: from 2.7 on, torch's Linux wheels are manylinux_2_28 and
# use the C++11 ABI only, which is what the factory's builds assume.
OLDEST_TORCH = "2.7"
SNAPSHOT = "upstream_snapshot.json"
FACTS_VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Origin:
    source: str  # the URL read, or for a declared fact the document it comes from
    fetched: str  # ISO 8601 UTC: when the index answered (declared: when it was written down)
    via: str = "get"  # "get" | "pep658" | "range" | "declared"
    note: str = ""

    @property
    def declared(self) -> bool:
        return self.via == "declared"

    def describe(self, *, now: float | None = None) -> str:
        if self.declared:
            return f"declared ({self.source}), not read from an index"
        how = {"range": " (METADATA read with HTTP range requests)",
               "pep658": " (PEP 658 metadata)"}.get(self.via, "")
        return f"{self.source}{how}, read {self.fetched} ({age(self.fetched, now=now)} ago)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelFile:
    filename: str
    sha256: str | None  # None for a declared build (no index listed the file)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TorchRelease:
    version: str
    published: str | None  # upload time of its first file (PEP 700), when the index says
    requires_python: str | None
    wheels: Mapping[str, tuple[str, ...]]  # CPU -> the CPythons of its Linux wheels on PyPI
    origin: Origin


@dataclasses.dataclass(frozen=True, kw_only=True)
class TorchBuild:
    version: str  # "2.14.1"
    cuda: str  # "13.0"
    index: str | None  # None: PyPI's build; else the per-CUDA index it is on
    release: str | None  # the CUDA release its requirements pin ("13.0.3"), when read
    files: Mapping[str, Mapping[str, WheelFile]]  # CPU -> Python -> wheel
    origin: Origin

    @property
    def on_pypi(self) -> bool:
        return self.index is None

    def label(self) -> str:
        return self.cuda + (" (PyPI's)" if self.on_pypi else "") + (
            " (declared)" if self.origin.declared else "")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackageRelease:
    project: str
    version: str
    sdist: str | None  # filename; None when the release has no sdist
    sha256: str | None
    published: str | None
    yanked: bool
    origin: Origin


def age(iso: str, *, now: float | None = None) -> str:
    """'2026-12-01T20:43:00Z' -> '3 h' (from now)."""
    try:
        then = dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "an unknown time"
    seconds = max(0.0, (now if now is not None else time.time()) - then)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def _minor(version: str) -> str:
    v = Version(version)
    return f"{v.major}.{v.minor}"


def _pythons(values: Iterable[str]) -> str:
    return ", ".join(sorted(values, key=lambda p: tuple(int(x) for x in p.split("."))))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Facts:
    torch: Mapping[str, TorchRelease]
    builds: tuple[TorchBuild, ...]
    packages: Mapping[str, Mapping[str, PackageRelease]]  # canonical name -> version -> release
    cuda_releases: tuple[str, ...] = ()  # CUDA minors NVIDIA ships (cuda-toolkit on PyPI)
    generated: str  # the newest answer the facts were made from
    notes: tuple[str, ...] = ()  # what could not be read live, and what was used instead
    kind: str = "snapshot"  # where this object was loaded from: "snapshot" | "cache" | "live"
    path: str | None = None

    # -- reading ------------------------------------------------------------------------------
    def torch_versions(self) -> list[Version]:
        return sorted(Version(v) for v in self.torch)

    def builds_of(self, version: str) -> list[TorchBuild]:
        return sorted((b for b in self.builds if b.version == version),
                      key=lambda b: (Version(b.cuda), not b.on_pypi))

    def pypi_build(self, version: str, platform: str) -> TorchBuild | None:
        """PyPI's CUDA build of ``version`` for ``platform``; None when PyPI's wheel for that
        CPU is a CPU build (or there is none)."""
        for b in self.builds_of(version):
            if b.on_pypi and platform in b.files:
                return b
        return None

    def describe(self) -> str:
        where = {"snapshot": "the shipped snapshot of", "cache": "the cached index answers of",
                 "live": "the indexes as read at"}.get(self.kind, f"{self.kind} of")
        return f"{where} {self.generated}"

    def build_for(self, *, torch: str, cuda: str, platform: str, python: str) -> TorchBuild:
        """The build a cell installs: PyPI's where it is that CUDA for that CPU and Python,
        else the per-CUDA index's. A pair that does not exist is a ConfigError naming what
        does (one line)."""
        self.check_release(torch)
        builds = self.builds_of(torch)
        same = [b for b in builds if b.cuda == cuda]
        if not same:
            names = ", ".join(dict.fromkeys(b.label() for b in builds)) or "none"
            major = cuda.split(".")[0]
            if major not in {b.cuda.split(".")[0] for b in builds}:
                raise ConfigError(
                    f"no build of torch {torch} uses CUDA {major}.x (its builds: {names}); "
                    "torch's extension builder refuses a different CUDA major")
            raise ConfigError(
                f"torch {torch} has no CUDA {cuda} build (its builds: {names}); the toolkit "
                "must match torch.version.cuda")
        on_cpu = [b for b in same if platform in b.files]
        if not on_cpu:
            cpus = sorted({p for b in same for p in b.files})
            pypi = self.torch[torch].wheels.get(platform)
            why = (f"; PyPI's {platform} torch {torch} is a CPU build" if pypi else "")
            raise ConfigError(
                f"torch {torch}'s CUDA {cuda} build has no {platform} wheel "
                f"(it has {', '.join(cpus) or 'none'}){why}")
        fits = [b for b in on_cpu if python in b.files[platform]]
        if not fits:
            have = {p for b in on_cpu for p in b.files[platform]}
            raise ConfigError(
                f"torch {torch} ships no cp{python.replace('.', '')} wheel for CUDA {cuda} on "
                f"{platform} (its Pythons: {_pythons(have)})")
        return fits[0]  # builds_of puts PyPI's first

    def check_release(self, torch: str) -> TorchRelease:
        release = self.torch.get(torch)
        if release is not None:
            return release
        try:
            minor = _minor(torch)
        except InvalidVersion:
            raise ConfigError(f"unparseable torch version {torch!r}") from None
        same = [str(v) for v in self.torch_versions() if f"{v.major}.{v.minor}" == minor]
        tip = "'factory lock' reads the indexes again (or 'factory facts refresh')"
        if same:
            raise ConfigError(f"torch {torch} is not a release (torch {minor}: "
                              f"{', '.join(same)}; {self.describe()})", tip=tip)
        newest = self.torch_versions()[-1] if self.torch else "none"
        raise ConfigError(
            f"torch {torch} is not a torch release in {self.describe()} (newest: {newest}; "
            f"oldest covered: {OLDEST_TORCH})", tip=tip)

    # -- the file format ------------------------------------------------------------------------
    def as_json(self) -> dict[str, Any]:
        def origin(o: Origin) -> dict[str, str]:
            d = {"source": o.source, "fetched": o.fetched, "via": o.via}
            return {**d, "note": o.note} if o.note else d

        return {
            "version": FACTS_VERSION,
            "generated": self.generated,
            "notes": list(self.notes),
            "cuda_releases": list(self.cuda_releases),
            "torch": {
                v: {"published": r.published, "requires_python": r.requires_python,
                    "wheels": {p: list(py) for p, py in sorted(r.wheels.items())},
                    "origin": origin(r.origin)}
                for v, r in sorted(self.torch.items(), key=lambda kv: Version(kv[0]))
            },
            "builds": [
                {"torch": b.version, "cuda": b.cuda, "index": b.index, "release": b.release,
                 "files": {p: {py: f"{f.filename} {f.sha256 or ''}".strip()
                                for py, f in sorted(fs.items())}
                           for p, fs in sorted(b.files.items())},
                 "origin": origin(b.origin)}
                for b in sorted(self.builds, key=lambda b: (Version(b.version), Version(b.cuda),
                                                            b.index or ""))
            ],
            "packages": {
                name: {v: {"sdist": r.sdist, "sha256": r.sha256, "published": r.published,
                           "yanked": r.yanked, "origin": origin(r.origin)}
                       for v, r in sorted(rel.items(), key=lambda kv: Version(kv[0]))}
                for name, rel in sorted(self.packages.items())
            },
        }

    def dumps(self) -> str:
        return json.dumps(self.as_json(), indent=1, sort_keys=True) + "\n"

    @classmethod
    def loads(cls, text: str, *, kind: str, path: str | None = None) -> Facts:
        try:
            doc = json.loads(text)
            if doc.get("version") != FACTS_VERSION:
                raise ValueError(f"facts version {doc.get('version')!r}")
            return cls._from_json(doc, kind=kind, path=path)
        except (ValueError, KeyError, TypeError, AttributeError, InvalidVersion) as exc:
            raise ConfigError(f"unreadable torch/package facts in {path or kind}: {exc}") from None

    @classmethod
    def _from_json(cls, doc: dict[str, Any], *, kind: str, path: str | None) -> Facts:
        def origin(d: dict[str, str]) -> Origin:
            return Origin(source=d["source"], fetched=d["fetched"], via=d.get("via", "get"),
                          note=d.get("note", ""))

        torch = {
            v: TorchRelease(version=v, published=r.get("published"),
                            requires_python=r.get("requires_python"),
                            wheels={p: tuple(py) for p, py in r["wheels"].items()},
                            origin=origin(r["origin"]))
            for v, r in doc["torch"].items()
        }
        builds = tuple(
            TorchBuild(version=b["torch"], cuda=b["cuda"], index=b.get("index"),
                       release=b.get("release"),
                       files={p: {py: _wheel_file(f) for py, f in fs.items()}
                              for p, fs in b["files"].items()},
                       origin=origin(b["origin"]))
            for b in doc["builds"]
        )
        packages = {
            name: {v: PackageRelease(project=name, version=v, sdist=r.get("sdist"),
                                     sha256=r.get("sha256"), published=r.get("published"),
                                     yanked=bool(r.get("yanked")), origin=origin(r["origin"]))
                   for v, r in rel.items()}
            for name, rel in doc["packages"].items()
        }
        return cls(torch=torch, builds=builds, packages=packages,
                   cuda_releases=tuple(doc.get("cuda_releases", ())), generated=doc["generated"],
                   notes=tuple(doc.get("notes", ())), kind=kind, path=path)


def _wheel_file(text: str) -> WheelFile:
    """'<filename> <sha256>', or '' for a declared build's wheel (no index listed it)."""
    name, _, sha = text.partition(" ")
    return WheelFile(filename=name, sha256=sha or None)


# -- where facts are kept -----------------------------------------------------------------------

def cache_dir(work_dir: Path) -> Path:
    """The index answers and the facts made from them, under the work dir."""
    return work_dir / "upstream"


def cached_facts_path(work_dir: Path) -> Path:
    return cache_dir(work_dir) / "facts.json"


def snapshot_text() -> str:
    return importlib.resources.files("factory.data").joinpath(SNAPSHOT).read_text()


@functools.cache
def shipped_snapshot() -> Facts:
    return Facts.loads(snapshot_text(), kind="snapshot", path=f"factory/data/{SNAPSHOT}")


@functools.cache
def _cached(path: str, mtime_ns: int) -> Facts:
    return Facts.loads(Path(path).read_text(), kind="cache", path=path)


def load_facts(work_dir: Path) -> Facts:
    """The newest facts this builder has: the cache under ``work_dir`` when it is at least as
    new as the shipped snapshot, else the snapshot. Never touches the network."""
    snapshot = shipped_snapshot()
    # FACTORY_FACTS=snapshot: every command uses the shipped snapshot (reproducible tests and
    # runs that must not depend on what this builder read last)
    if env_value(FACTS_ENV) == "snapshot":
        return snapshot
    path = cached_facts_path(work_dir)
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return snapshot
    try:
        cached = _cached(str(path), mtime)
    except ConfigError:
        return snapshot  # a damaged cache is no reason to stop: the snapshot still holds
    if cached.generated < snapshot.generated:
        return snapshot
    missing = {k: v for k, v in snapshot.packages.items() if k not in cached.packages}
    if missing:  # the cache holds the projects of the matrix last locked here
        return dataclasses.replace(cached, packages={**cached.packages, **missing})
    return cached


def save_facts(facts: Facts, work_dir: Path) -> Path:
    path = cached_facts_path(work_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".facts.")
    with os.fdopen(fd, "w") as fh:
        fh.write(facts.dumps())
    os.replace(tmp, path)
    return path
