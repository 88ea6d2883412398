"""Facts from the indexes: torch's releases from PyPI's simple page, the CUDA of PyPI's builds
from their wheels' metadata, the other CUDA builds from PyTorch's per-CUDA indexes (their URLs
made from one pattern, for every CUDA minor NVIDIA ships: the releases of ``cuda-toolkit`` on
PyPI), and the packages' releases and sdist hashes from PyPI."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from factory.errors import UpstreamError
from factory.upstream.facts import (
    OLDEST_TORCH,
    Facts,
    Origin,
    PackageRelease,
    TorchBuild,
    TorchRelease,
    WheelFile,
)
from factory.upstream.simple import IndexFile, project_files, project_url
from factory.upstream.sources import Response, Source, now_iso
from factory.upstream.wheel_metadata import cuda_pin

_log = logging.getLogger(__name__)

PYPI_SIMPLE = "https://pypi.org/simple/"
PYTORCH_PATTERN = "https://download.pytorch.org/whl/{cuda_tag}"
# Linux wheel tags a torch build ships, and the CPU each names.
_LINUX = re.compile(r"^(?:manylinux_\d+_\d+|manylinux\d+|linux)_(x86_64|aarch64)$")
_CPYTHON = re.compile(r"^cp3(\d+)$")  # cp311; free-threaded cp313t is another ABI: not built


@dataclasses.dataclass(frozen=True, kw_only=True)
class Indexes:
    """Where the facts are read: PyPI's simple API (or a mirror of it) and the pattern of
    PyTorch's per-CUDA indexes ({cuda_tag}: cu130; {cuda}: 13.0)."""

    pypi: str = PYPI_SIMPLE
    pytorch: str = PYTORCH_PATTERN

    def pytorch_index(self, cuda: str) -> str:
        major, minor = cuda.split(".")
        return self.pytorch.format(cuda_tag=f"cu{major}{minor}", cuda=cuda).rstrip("/")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Declared:
    """A torch build no index could be asked about, written down with where it comes from."""

    torch_minor: str
    cuda: str
    source: str
    written: str  # the date it was written down


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Wheel:
    file: IndexFile
    version: Version
    python: str  # "3.11"
    platform: str  # "x86_64"
    build: tuple[int, str] | tuple[()]


def _linux_wheels(files: Iterable[IndexFile]) -> list[_Wheel]:
    out = []
    for f in files:
        if not f.filename.endswith(".whl") or f.yanked:
            continue
        try:
            _, version, build, tags = parse_wheel_filename(f.filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        for tag in tags:
            cpu = _LINUX.match(tag.platform)
            py = _CPYTHON.match(tag.interpreter)
            if cpu and py and tag.abi == tag.interpreter:
                out.append(_Wheel(file=f, version=version, python=f"3.{py.group(1)}",
                                  platform=cpu.group(1), build=build))
                break
    return out


def _newest_build(wheels: Iterable[_Wheel]) -> dict[tuple[str, str, str], _Wheel]:
    """(version, CPU, Python) -> the wheel pip picks: the highest build number."""
    best: dict[tuple[str, str, str], _Wheel] = {}
    for w in wheels:
        key = (str(w.version), w.platform, w.python)
        if key not in best or w.build > best[key].build:
            best[key] = w
    return best


def _origin(response: Response, note: str = "") -> Origin:
    return Origin(source=response.url, fetched=response.fetched, via=response.via, note=note)


def _page(source: Source, url: str) -> Response:
    response = source.page(url)
    if not response.ok:
        raise UpstreamError(f"{url} answered HTTP {response.status}")
    return response


def read_facts(source: Source, *, indexes: Indexes = Indexes(), projects: Iterable[str] = (),
               fallback: Facts | None = None, declared: Sequence[Declared] = (),
               since: str = OLDEST_TORCH) -> Facts:
    """Read everything the matrix may need. PyPI must answer; where PyTorch's indexes cannot be
    reached, their builds come from ``fallback`` (the facts read before) or ``declared``, and
    a note says so."""
    notes: list[str] = []
    torch_page = _page(source, project_url(indexes.pypi, "torch"))
    wheels = [w for w in _linux_wheels(project_files(torch_page))
              if not w.version.is_prerelease and w.version.local is None
              and w.version >= Version(since)]
    chosen = _newest_build(wheels)
    releases = _torch_releases(torch_page, chosen)
    builds = _pypi_builds(source, chosen)
    cuda_page = _page(source, project_url(indexes.pypi, "cuda-toolkit"))
    cuda_releases = _cuda_minors(project_files(cuda_page))
    candidates = sorted({*cuda_releases, *(b.cuda for b in (fallback.builds if fallback else ())),
                         *(d.cuda for d in declared)}, key=Version)
    pytorch, note = _pytorch_builds(source, indexes, candidates, releases)
    if pytorch is None:
        used = (f"their builds are those of {fallback.describe()}" if fallback is not None
                else "their builds are the declared ones, not read from an index")
        notes.append(f"{note}; {used}")
        pytorch = _builds_without_index(releases, builds, indexes, fallback, declared)
    builds.extend(pytorch)
    packages: dict[str, dict[str, PackageRelease]] = {
        str(canonicalize_name(p)): _package(source, indexes, p) for p in projects}
    answered = [torch_page.fetched, cuda_page.fetched,
                *(b.origin.fetched for b in builds if not b.origin.declared),
                *(r.origin.fetched for rel in packages.values() for r in rel.values())]
    return Facts(torch=releases, builds=tuple(builds), packages=packages,
                 cuda_releases=tuple(cuda_releases), generated=max(answered, default=now_iso()),
                 notes=tuple(notes), kind="live")


def _torch_releases(page: Response, chosen: Mapping[tuple[str, str, str], _Wheel]
                    ) -> dict[str, TorchRelease]:
    by_version: dict[str, list[_Wheel]] = defaultdict(list)
    for (version, _, _), w in chosen.items():
        by_version[version].append(w)
    out = {}
    for version, ws in by_version.items():
        cpus: dict[str, set[str]] = defaultdict(set)
        for w in ws:
            cpus[w.platform].add(w.python)
        times = sorted(t for w in ws if (t := w.file.upload_time))
        out[version] = TorchRelease(
            version=version, published=times[0] if times else None,
            requires_python=ws[0].file.requires_python,
            wheels={p: tuple(sorted(py, key=lambda s: int(s.split(".")[1])))
                    for p, py in sorted(cpus.items())},
            origin=_origin(page))
    return out


def _pypi_builds(source: Source, chosen: Mapping[tuple[str, str, str], _Wheel]
                 ) -> list[TorchBuild]:
    """PyPI's build of each version: per CPU, the CUDA its wheels' requirements pin (read from
    one wheel per version and CPU: the pins do not differ by Python). CPUs whose wheels pin
    the same CUDA release share one build; a CPU whose wheel pins none is a CPU build."""
    groups: dict[tuple[str, str], dict[str, _Wheel]] = defaultdict(dict)
    for (version, cpu, python), w in chosen.items():
        groups[(version, cpu)][python] = w
    origins: dict[tuple[str, str, str], Origin] = {}
    files: dict[tuple[str, str, str], dict[str, dict[str, WheelFile]]] = defaultdict(dict)
    for (version, cpu), per_python in sorted(groups.items()):
        sample = per_python.get("3.11") or per_python[min(per_python)]
        meta = source.metadata(sample.file.url, pep658=sample.file.core_metadata)
        pin = cuda_pin(meta.body, platform=cpu, python=sample.python)
        if pin is None:
            continue
        key = (version, pin.cuda, pin.release)
        origins.setdefault(key, _origin(meta, f"{pin.requirement} in {sample.file.filename}"))
        files[key][cpu] = {py: WheelFile(filename=w.file.filename, sha256=w.file.sha256)
                           for py, w in per_python.items()}
    return [TorchBuild(version=version, cuda=cuda, index=None, release=release,
                       files=files[(version, cuda, release)], origin=origin)
            for (version, cuda, release), origin in origins.items()]


def _cuda_minors(files: Iterable[IndexFile]) -> list[str]:
    """The CUDA minors NVIDIA ships as ``cuda-toolkit`` releases (final ones)."""
    minors = set()
    for f in files:
        try:
            version = (parse_wheel_filename(f.filename)[1] if f.filename.endswith(".whl")
                       else parse_sdist_filename(f.filename)[1])
        except (InvalidWheelFilename, InvalidVersion, ValueError):
            continue
        if not version.is_prerelease and not f.yanked:
            minors.add(f"{version.major}.{version.minor}")
    return sorted(minors, key=Version)


def _pytorch_builds(source: Source, indexes: Indexes, candidates: Sequence[str],
                    releases: Mapping[str, TorchRelease]
                    ) -> tuple[list[TorchBuild] | None, str]:
    """Every build of a known torch release on the per-CUDA indexes; (None, why) when their
    host cannot be reached at all."""
    out: list[TorchBuild] = []
    for cuda in candidates:
        index = indexes.pytorch_index(cuda)
        try:
            response = source.page(project_url(index, "torch"))
        except UpstreamError as exc:
            return None, (f"PyTorch's per-CUDA indexes ({indexes.pytorch}) could not be read "
                          f"({exc.message})")
        if not response.ok:
            continue  # no index for this CUDA
        tag = "cu" + cuda.replace(".", "")
        wheels = [w for w in _linux_wheels(project_files(response))
                  if w.version.local == tag and w.version.public in releases]
        per_version: dict[str, dict[str, dict[str, WheelFile]]] = defaultdict(
            lambda: defaultdict(dict))
        for (version, cpu, python), w in sorted(_newest_build(wheels).items()):
            public = Version(version).public
            per_version[public][cpu][python] = WheelFile(filename=w.file.filename,
                                                         sha256=w.file.sha256)
        for version, files in per_version.items():
            out.append(TorchBuild(version=version, cuda=cuda, index=index, release=None,
                                  files={c: dict(p) for c, p in files.items()},
                                  origin=_origin(response)))
    return out, ""


def _builds_without_index(releases: Mapping[str, TorchRelease], pypi: Sequence[TorchBuild],
                          indexes: Indexes, fallback: Facts | None,
                          declared: Sequence[Declared]) -> list[TorchBuild]:
    """The per-CUDA builds when their indexes cannot be read: those of the facts read before,
    else the declared ones (assumed to ship PyPI's CPUs and Pythons, without file hashes)."""
    if fallback is not None:
        return [b for b in fallback.builds if not b.on_pypi and b.version in releases]
    out = []
    on_pypi = {(b.version, b.cuda) for b in pypi}
    for d in declared:
        for version, release in releases.items():
            if f"{Version(version).major}.{Version(version).minor}" != d.torch_minor:
                continue
            if (version, d.cuda) in on_pypi:
                continue  # PyPI's own build, read from its metadata
            files = {cpu: {py: WheelFile(filename="", sha256=None) for py in pys}
                     for cpu, pys in release.wheels.items()}
            out.append(TorchBuild(
                version=version, cuda=d.cuda, index=indexes.pytorch_index(d.cuda), release=None,
                files=files,
                origin=Origin(source=d.source, fetched=d.written, via="declared",
                              note="CPUs and Pythons assumed from PyPI's wheels")))
    return out


def _package(source: Source, indexes: Indexes, project: str) -> dict[str, PackageRelease]:
    page = _page(source, project_url(indexes.pypi, project))
    out: dict[str, PackageRelease] = {}
    for f in project_files(page):
        if f.filename.endswith(".whl"):
            continue
        try:
            _, version = parse_sdist_filename(f.filename)
        except (ValueError, InvalidVersion):
            continue
        key = str(version)
        out[key] = PackageRelease(project=canonicalize_name(project), version=key,
                                  sdist=f.filename, sha256=f.sha256, published=f.upload_time,
                                  yanked=f.yanked, origin=_origin(page))
    return out
