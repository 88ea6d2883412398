"""The host doctor: read this host, then find the index's wheel that fits it and the exact install
line, or say exactly why none fits.

Check, then decide: ``read_host`` gathers facts into a frozen ``HostInfo`` (nothing is decided
there); ``read_index`` reads the PEP 503 pages; ``choose`` filters the index's files step by step
(Python, platform/glibc, torch minor, torch's CUDA, driver, GPU arch) and, when a step leaves
nothing, words the reason from what that step threw away.

torch is probed in a subprocess (``python -c``) so a broken torch install (a missing CUDA
library, an ABI mismatch) is reported instead of crashing the doctor, and so the doctor can
inspect another environment's interpreter (``--python``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.resources
import json
import platform
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import tomllib
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from factory.errors import CellError, StoreError, UsageError, WheelError
from factory.links import Anchor, parse_anchors
from factory.matrix.cell import arch_cc, parse_platform, sm_name, sm_names
from factory.matrix.manylinux import glibc_text, host_glibc
from factory.matrix.tags import VARIANT_RE, LocalTag, parse_local
from factory.matrix.tags import platform_tag_parts as _manylinux
from factory.recipes import default_archs_for

NO_FIT_EXIT = 1  # the doctor ran fine but no wheel fits: scripts branch on this
_TORCH_MARK = "FACTORY-DOCTOR:"
_TORCH_PROBE = f"""
import json, sys
out = {{"python": "%d.%d" % sys.version_info[:2], "implementation": sys.implementation.name}}
try:
    import torch
    out["torch"] = str(torch.__version__)
    out["torch_cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
except BaseException as exc:
    out["torch_error"] = "%s: %s" % (type(exc).__name__,
                                     str(exc).splitlines()[0] if str(exc) else "")
print({_TORCH_MARK!r} + json.dumps(out))
"""
# Grace superchips by GPU name: "NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA GB10".
_GRACE_RE = re.compile(r"\bG[BH]\d{2,3}\b", re.IGNORECASE)
_SMI_LINE = re.compile(
    r"^\s*(?P<name>[^,]+?)\s*,\s*(?P<cc>\d+\.\d+)\s*,\s*(?P<driver>\d+(?:\.\d+)+)\s*$"
)
NVIDIA_SMI_QUERY = ("--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader")


# -- the host ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    sm: int  # compute capability 9.0 -> 90


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostInfo:
    python: str  # "3.11"
    python_exe: str
    torch: str | None  # public version, "2.14.1"
    torch_local: str | None  # "cu130" from "2.14.1+cu130"
    torch_cuda: str | None  # torch.version.cuda; None for a CPU build
    torch_error: str | None  # why torch could not be read
    driver: str | None
    gpus: tuple[Gpu, ...]
    gpu_source: str | None  # "nvidia-smi" | "nvml" | "recorded" | None
    gpu_note: str | None  # why no GPU was read, when none was
    glibc: tuple[int, int] | None
    machine: str  # "x86_64" or "aarch64" (wheel-tag spelling: "arm64" is read as "aarch64")

    @property
    def grace(self) -> str | None:
        """The Grace superchip this host is (GH200, GB200, GB300, GB10), from the GPU names, on
        an aarch64 host; None elsewhere. Their GPUs are sm_90/sm_100/sm_103/sm_121 like the
        x86_64 parts', but they need linux_aarch64 wheels."""
        if self.machine != "aarch64":
            return None
        for g in self.gpus:
            m = _GRACE_RE.search(g.name)
            if m:
                return m.group(0).upper()
        return None

    @property
    def torch_minor(self) -> str | None:
        if self.torch is None:
            return None
        v = Version(self.torch)
        return f"{v.major}.{v.minor}"

    @property
    def variant(self) -> str | None:
        if self.torch_minor is None or not self.torch_cuda:
            return None
        maj, _, mnr = self.torch_cuda.partition(".")
        return f"cu{maj}{mnr.split('.')[0]}-torch{self.torch_minor}"

    @property
    def sms(self) -> tuple[int, ...]:
        return tuple(sorted({g.sm for g in self.gpus}))

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["glibc"] = None if self.glibc is None else glibc_text(self.glibc)
        d["gpus"] = [{"name": g.name, "sm": g.sm, "compute_capability": arch_cc(g.sm)}
                     for g in self.gpus]
        d["variant"] = self.variant
        d["grace"] = self.grace
        d["max_cuda"] = driver_max_cuda(self.driver) if self.driver else None
        return d


def parse_nvidia_smi(text: str) -> tuple[str | None, tuple[Gpu, ...], str | None]:
    """(driver, GPUs, note) from ``nvidia-smi --query-gpu=name,compute_cap,driver_version
    --format=csv,noheader``. Lines that are not GPU rows (nvidia-smi's own error text on a host
    whose driver is not loaded) become the note."""
    gpus, drivers, other = [], set(), []
    for line in text.splitlines():
        m = _SMI_LINE.match(line)
        if m:
            major, minor = m.group("cc").split(".")
            gpus.append(Gpu(name=m.group("name"), sm=int(major) * 10 + int(minor)))
            drivers.add(m.group("driver"))
        elif line.strip():
            other.append(line.strip())
    driver = sorted(drivers)[0] if drivers else None
    note = None if gpus else (other[0] if other else "nvidia-smi listed no GPU")
    return driver, tuple(gpus), note


def _read_nvml() -> tuple[str | None, tuple[Gpu, ...], str | None] | None:
    """None when pynvml is not importable; else what NVML says."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, (), f"NVML: {exc}"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(Gpu(name=name.decode() if isinstance(name, bytes) else str(name),
                            sm=int(major) * 10 + int(minor)))
        return driver, tuple(gpus), None if gpus else "NVML listed no GPU"
    except Exception as exc:
        return None, (), f"NVML: {exc}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def read_gpus(
    nvidia_smi_output: Path | None = None,
) -> tuple[str | None, tuple[Gpu, ...], str | None, str | None]:
    """(driver, GPUs, source, note). A recorded output file stands in for the host's GPUs."""
    if nvidia_smi_output is not None:
        try:
            text = Path(nvidia_smi_output).read_text(errors="replace")
        except OSError as exc:
            raise UsageError(f"cannot read {nvidia_smi_output}: {exc.strerror}") from None
        driver, gpus, note = parse_nvidia_smi(text)
        return driver, gpus, "recorded", note
    notes = []
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run([smi, *NVIDIA_SMI_QUERY], capture_output=True, text=True,
                                  timeout=60)
            driver, gpus, note = parse_nvidia_smi(proc.stdout + "\n" + proc.stderr)
            if gpus:
                return driver, gpus, "nvidia-smi", None
            notes.append(f"nvidia-smi: {note}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            notes.append(f"nvidia-smi: {exc}")
    else:
        notes.append("nvidia-smi not found")
    nvml = _read_nvml()
    if nvml is None:
        notes.append("pynvml not importable")
    else:
        driver, gpus, note = nvml
        if gpus:
            return driver, gpus, "nvml", None
        notes.append(note or "NVML listed no GPU")
    return None, (), None, "; ".join(notes)


def probe_torch(python_exe: str) -> dict[str, Any]:
    try:
        proc = subprocess.run([python_exe, "-c", _TORCH_PROBE], capture_output=True, text=True,
                              timeout=300)
    except FileNotFoundError:
        raise UsageError(f"no Python interpreter at {python_exe}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"torch_error": f"cannot run {python_exe}: {exc}"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_TORCH_MARK):
            try:
                return dict(json.loads(line[len(_TORCH_MARK):]))
            except ValueError:
                break
    # The interpreter itself died (a segfault while importing torch is the classic case).
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"torch_error": f"{python_exe} exited with {proc.returncode} while importing torch: "
                           f"{last}"}


def host_machine(raw: str | None = None) -> str:
    """platform.machine() in wheel-tag spelling ('arm64' -> 'aarch64', 'AMD64' -> 'x86_64')."""
    raw = platform.machine() if raw is None else raw
    try:
        return parse_platform(raw or "x86_64")
    except CellError:
        return raw.lower()


def read_host(*, python_exe: str | None = None, nvidia_smi_output: Path | None = None,
              machine: str | None = None) -> HostInfo:
    exe = python_exe or sys.executable
    probe = probe_torch(exe)
    torch_full = probe.get("torch")
    torch = torch_local = None
    error = probe.get("torch_error")
    if torch_full:
        try:
            v = Version(str(torch_full))
            torch, torch_local = v.public, v.local
        except InvalidVersion:
            error = f"torch reports an unparseable version {torch_full!r}"
    driver, gpus, source, note = read_gpus(nvidia_smi_output)
    cuda = probe.get("torch_cuda")
    return HostInfo(
        python=str(probe.get("python") or f"{sys.version_info[0]}.{sys.version_info[1]}"),
        python_exe=exe,
        torch=torch,
        torch_local=torch_local,
        torch_cuda=str(cuda) if cuda else None,
        torch_error=error,
        driver=driver,
        gpus=gpus,
        gpu_source=source,
        gpu_note=note,
        glibc=host_glibc(),
        machine=host_machine(machine),
    )


# -- driver -> CUDA --------------------------------------------------------------------------------
@functools.cache
def driver_table() -> dict[str, str]:
    text = importlib.resources.files("factory.data").joinpath("driver_cuda.toml").read_text()
    return dict(tomllib.loads(text)["minimum_driver"])


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def driver_max_cuda(driver: str) -> str | None:
    """The newest CUDA release whose minimum driver this driver meets ('580.95.05' -> '13.0')."""
    have = _version_tuple(driver)
    ok = [c for c, need in driver_table().items() if _version_tuple(need) <= have]
    return max(ok, key=_version_tuple) if ok else None


def driver_runs_cuda(driver: str, cuda: str) -> bool:
    """Minor-version compatibility: the X.0 minimum covers every X.Y (cubin-only wheels)."""
    major = cuda.split(".")[0]
    minimum = driver_table().get(f"{major}.0")
    if minimum is None:
        return False
    return _version_tuple(driver) >= _version_tuple(minimum)


# -- the index -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexFile:
    filename: str
    project: str
    version: Version
    interpreters: frozenset[str]
    abis: frozenset[str]
    platforms: frozenset[str]
    local: LocalTag | None  # None: not a factory-tagged wheel
    yanked: str | None

    @property
    def cuda(self) -> str | None:
        return self.local.cuda if self.local else None

    @property
    def variant(self) -> str | None:
        """The per-variant index this file is on: 'cu130-torch2.14-sm100' (see tags.py)."""
        if self.local is None:
            return None
        return self.local.variant


def _file_from_link(anchor: Anchor) -> IndexFile | None:
    attrs, text, href = anchor.attrs, anchor.text, anchor.href
    name = urllib.parse.unquote(href.split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]) or text
    if not name.endswith(".whl"):
        return None  # sdists and other files: the doctor installs wheels only
    try:
        dist, version, _, tags = parse_wheel_filename(name)
    except Exception:  # a malformed name on someone's index is not the doctor's failure
        return None
    try:
        local = parse_local(version.local) if version.local else None
    except WheelError:
        local = None
    return IndexFile(
        filename=name,
        project=canonicalize_name(dist),
        version=version,
        interpreters=frozenset(t.interpreter for t in tags),
        abis=frozenset(t.abi for t in tags),
        platforms=frozenset(t.platform for t in tags),
        local=local,
        yanked=attrs.get("data-yanked") if "data-yanked" in attrs else None,
    )


class IndexReader:
    """A factory index tree read through a directory path or an http(s)/file URL (stdlib only).

    ``root`` is the tree's top: ``<root>/simple/<project>/`` holds every variant and
    ``<root>/<variant>/simple/<project>/`` one each. A URL that already ends in ``/simple/`` (or
    ``/<variant>/simple/``) is taken back to the top."""

    def __init__(self, location: str) -> None:
        self.location = location
        if re.match(r"^https?://", location):
            self._dir: Path | None = None
            base = location.rstrip("/")
        else:
            path = Path(location[len("file://"):] if location.startswith("file://") else location)
            if not path.is_dir():
                raise UsageError(f"index {location!r} is neither an http(s) URL nor a directory")
            self._dir = path.resolve()
            base = self._dir.as_uri()
        parts = base.split("/")
        if parts[-1] == "simple":
            parts.pop()
            if parts and VARIANT_RE.match(parts[-1]):
                parts.pop()
        self.root_url = "/".join(parts)

    def variant_url(self, variant: str | None) -> str:
        return f"{self.root_url}/{variant}/simple/" if variant else f"{self.root_url}/simple/"

    def _get(self, rel: str) -> bytes | None:
        """A page by path below the root; None when it does not exist."""
        if self._dir is not None:
            path = self._dir / rel / "index.html"
            try:
                return path.read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
            except OSError as exc:
                raise StoreError(f"cannot read {path}: {exc.strerror}") from None
        url = f"{self.root_url}/{rel}/"
        request = urllib.request.Request(url, headers={"Accept": "text/html"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise StoreError(f"index {url} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StoreError(f"cannot reach the index at {url}: {reason}") from None

    def projects(self) -> list[str]:
        page = self._get("simple")
        if page is None:
            raise StoreError(
                f"no index at {self.location}: {self.variant_url(None)} does not exist",
                tip="point --index at the index root (the directory or URL above simple/)",
            )
        return sorted({canonicalize_name(a.text or a.href.strip("/")) for a in parse_anchors(page)})

    def files(self, project: str, variant: str | None = None) -> list[IndexFile] | None:
        rel = f"{variant}/simple/{project}" if variant else f"simple/{project}"
        page = self._get(rel)
        if page is None:
            return None
        out = [f for a in parse_anchors(page) if (f := _file_from_link(a))]
        return [f for f in out if f.project == project]


# -- choosing ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    project: str
    wheel: str | None
    variant: str | None
    install: str | None  # the exact command line; None when nothing fits
    why: str | None  # why nothing fits
    warnings: tuple[str, ...] = ()
    index_url: str | None = None  # the index URL of the install line
    requirement: str | None = None  # 'flash-attn' or 'flash-attn==2.8.3+cu130torch2.14sm100'

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fits": self.wheel is not None,
                "warnings": list(self.warnings)}


def _python_ok(f: IndexFile, py: str) -> bool:
    cp = "cp" + py.replace(".", "")
    interp_ok = bool(f.interpreters & {cp, "py3", "py" + py.replace(".", "")})
    abi_ok = bool(f.abis & {cp, "abi3", "none"})
    return interp_ok and abi_ok


def _platform_ok(f: IndexFile, host: HostInfo) -> bool:
    for tag in f.platforms:
        glibc, arch = _manylinux(tag)
        if arch == "any":
            return True
        if arch != host.machine:
            continue
        if glibc is None or (host.glibc is not None and glibc <= host.glibc):
            return True
    return False


def _needed_glibc(files: Iterable[IndexFile]) -> str:
    needs = set()
    for f in files:
        for tag in f.platforms:
            glibc, _ = _manylinux(tag)
            if glibc:
                needs.add(glibc)
    return glibc_text(min(needs)) if needs else "?"


def _sm_runs(gpu_sm: int, built: int) -> bool:
    """A cubin for sm_XY runs on sm_XZ with Z >= Y (same major): sm_80 code runs on sm_86, but
    sm_100 code does not run on sm_120."""
    return gpu_sm // 10 == built // 10 and gpu_sm % 10 >= built % 10


def _arch_set(f: IndexFile, default_archs: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if f.local is not None and f.local.archs is not None:
        return f.local.archs
    return default_archs


def _archs_text(archs: tuple[int, ...]) -> str:
    return sm_names(archs, sep="+")


def _join(items: Sequence[str]) -> str:
    items = list(dict.fromkeys(items))
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _gpus_text(host: HostInfo) -> str:
    by_sm: dict[int, str] = {}
    for g in host.gpus:
        by_sm.setdefault(g.sm, g.name)
    parts = [f"{sm_name(sm)} ({name})" for sm, name in sorted(by_sm.items())]
    return ("the GPU is " if len(parts) == 1 else "the GPUs are ") + _join(parts)




def choose(host: HostInfo, project: str, files: Sequence[IndexFile], reader: IndexReader) -> Choice:
    """The wheel of ``project`` for this host: each step narrows the files or says why none
    fits."""
    project = canonicalize_name(project)
    warnings: list[str] = []
    fitting = list(files)
    for step in _STEPS:
        narrowed = step(host, project, fitting, warnings)
        if isinstance(narrowed, str):
            return Choice(project=project, wheel=None, variant=host.variant, install=None,
                          why=narrowed, warnings=tuple(warnings))
        fitting = narrowed
    return _pick(host, project, fitting, reader, warnings)


# A step of choose(): the files that still fit, or why none does; it may add warnings.
_Step = Callable[[HostInfo, str, list[IndexFile], list[str]], "list[IndexFile] | str"]


def _tagged(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    live = [f for f in files if f.yanked is None]
    if not files:
        return f"the index has no wheels of {project}"
    if not live:
        return f"every {project} wheel on the index is yanked"
    tagged = [f for f in live if f.local is not None]
    if not tagged:
        return (f"the index has no factory-tagged wheels of {project} "
                "(no +cuXYtorchA.B local version)")
    return tagged


def _for_python(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    step = [f for f in files if _python_ok(f, host.python)]
    if not step:
        have = sorted({i for f in files for i in f.interpreters})
        return f"Python is {host.python} but the index only has {project} for {_join(have)}"
    return step


def _for_platform(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    step = [f for f in files if _platform_ok(f, host)]
    above = [f for f in files if f not in step
             and any(_manylinux(t)[1] == host.machine for t in f.platforms)]
    if step and above:
        glibc = "unknown" if host.glibc is None else glibc_text(host.glibc)
        needs = sorted({f"{f.variant or f.filename} (glibc >= {_needed_glibc([f])})"
                        for f in above})
        warnings.append(f"this host's glibc is {glibc}: {len(above)} {project} wheel(s) on the "
                        f"index need a newer one and cannot install here: {_join(needs)}")
    if not step:
        arches = {_manylinux(t)[1] for f in files for t in f.platforms}
        if host.machine not in arches:
            return (f"this host is {host.machine} but the index only has {project} for "
                    f"{_join(sorted(arches))}")
        glibc = "unknown" if host.glibc is None else glibc_text(host.glibc)
        return (f"this host's glibc is {glibc} but every {project} wheel for Python {host.python} "
                f"needs glibc >= {_needed_glibc(files)}")
    return step


def _for_torch(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    minors = sorted({f.local.torch_minor for f in files if f.local}, key=_version_tuple)
    if host.torch is None:
        cause = host.torch_error or "torch is not installed"
        return (f"torch is not importable with {host.python_exe} ({cause}); {project} wheels are "
                f"per torch minor (the index has torch {_join(minors)}): install torch first")
    step = [f for f in files if f.local and f.local.torch_minor == host.torch_minor]
    if not step:
        return f"torch is {host.torch} but the index only has {project} for torch {_join(minors)}"
    return step


def _for_cuda(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    if not host.torch_cuda:
        return (f"torch {host.torch} is a CPU-only build (torch.version.cuda is None); "
                f"{project} needs a CUDA build of torch")
    want_cuda = _cuda_minor(host.torch_cuda)
    step = [f for f in files if f.cuda == want_cuda]
    if not step:
        cudas = sorted({f"cu{f.cuda.replace('.', '')}" for f in files if f.cuda},
                       key=_version_tuple)
        return (f"torch {host.torch} is built with CUDA {want_cuda} but the index only has "
                f"{_join(cudas)} builds of {project} for torch {host.torch_minor}")
    return step


def _for_driver(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    if host.driver:
        want_cuda = _cuda_minor(host.torch_cuda or "")
        if not driver_runs_cuda(host.driver, want_cuda):
            top = driver_max_cuda(host.driver) or "none known"
            need = driver_table().get(f"{want_cuda.split('.')[0]}.0", "?")
            return (f"the NVIDIA driver {host.driver} supports CUDA up to {top} but torch and the "
                    f"{project} wheels for {host.variant} use CUDA {want_cuda} "
                    f"(driver >= {need} needed)")
    elif host.gpus:
        warnings.append("the driver version is unknown: not checked against CUDA")
    return files


def _for_gpus(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    if not host.gpus:
        note = f" ({host.gpu_note})" if host.gpu_note else ""
        warnings.append(f"no NVIDIA GPU found{note}: chose by torch only; the wheel may lack "
                        "kernels for the GPU it will run on")
        return files
    default = default_archs_for(project)
    fits, unknown = [], []
    for f in files:
        archs = _arch_set(f, default)
        if archs is None:
            unknown.append(f)
        elif all(any(_sm_runs(sm, a) for a in archs) for sm in host.sms):
            fits.append(f)
    if not fits and unknown:
        warnings.append(
            f"{project}'s default arch set is unknown here: could not check the GPU arch")
        fits = unknown
    if not fits:
        known = {a for a in (_arch_set(f, default) for f in files) if a}
        sets = [_archs_text(a) for a in sorted(known)]
        return (f"{_gpus_text(host)} but the index only has {_join(sets)} builds of {project} "
                f"for {host.variant}")
    return fits


_STEPS: tuple[_Step, ...] = (
    _tagged, _for_python, _for_platform, _for_torch, _for_cuda, _for_driver, _for_gpus,
)


def _cuda_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def install_line(url: str, requirement: str) -> str:
    """The pip command that installs ``requirement`` from the per-variant index ``url`` (what the
    doctor prints, and the finder page beside each wheel)."""
    return f"pip install --extra-index-url {url} {requirement}"


def _pick(host: HostInfo, project: str, fitting: list[IndexFile], reader: IndexReader,
          warnings: list[str]) -> Choice:
    """The best of the fitting files, and the pip command that installs exactly it."""
    variant = host.variant
    assert variant is not None  # torch and its CUDA are known here
    default = default_archs_for(project)
    # Highest version first; among equals the widest arch set, which runs on the most GPUs.
    best = max(fitting, key=lambda f: (f.version, len(_arch_set(f, default) or ())))
    if not host.gpus:
        archs = _arch_set(best, default)
        if archs:
            warnings.append(f"{best.filename} holds kernels for {_archs_text(archs)} only")
    # The chosen file's own variant index holds one arch set (tags.py), so its URL is the one
    # that fits this host's GPU; pip takes the highest version there for this Python and
    # platform: pin when that is not the chosen file.
    variant = best.variant or variant
    variant_files = reader.files(project, variant)
    if variant_files is None:
        warnings.append(f"the index has no per-variant page for {variant}; using the combined "
                        "index")
        url = reader.variant_url(None)
        candidates = fitting
    else:
        url = reader.variant_url(variant)
        candidates = [f for f in variant_files if f.yanked is None and _python_ok(f, host.python)
                      and _platform_ok(f, host)]
    pip_pick = max((f.version for f in candidates), default=None)
    pinned = pip_pick != best.version or variant_files is None
    requirement = f"{project}=={best.version}" if pinned else project
    return Choice(
        project=project, wheel=best.filename, variant=variant,
        install=install_line(url, requirement), why=None,
        warnings=tuple(warnings),
        index_url=url, requirement=requirement,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DoctorReport:
    host: HostInfo
    index: str | None
    choices: tuple[Choice, ...]
    warnings: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return any(c.wheel for c in self.choices)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host.as_dict(),
            "index": self.index,
            "results": [c.as_dict() for c in self.choices],
            "warnings": list(self.warnings),
        }


def diagnose(host: HostInfo, index: str | None, packages: Sequence[str] = ()) -> DoctorReport:
    if index is None:
        return DoctorReport(host=host, index=None, choices=(),
                            warnings=("no --index given: pass the index URL to get an install "
                                      "line",))
    reader = IndexReader(index)
    projects = [canonicalize_name(p) for p in packages] or reader.projects()
    choices = []
    for project in projects:
        files = reader.files(project)
        if files is None and host.variant:
            files = reader.files(project, host.variant)
        choices.append(choose(host, project, files or [], reader))
    return DoctorReport(host=host, index=reader.root_url, choices=tuple(choices), warnings=())


def render_text(report: DoctorReport) -> str:
    h = report.host
    lines = ["host"]
    lines.append(f"  python      {h.python} ({h.python_exe})")
    if h.torch:
        cuda = f"CUDA {h.torch_cuda}" if h.torch_cuda else "CPU-only"
        local = f"+{h.torch_local}" if h.torch_local else ""
        lines.append(f"  torch       {h.torch}{local} ({cuda})")
    else:
        lines.append(f"  torch       not importable: {h.torch_error or 'not installed'}")
    if h.gpus:
        top = driver_max_cuda(h.driver) if h.driver else None
        lines.append(f"  driver      {h.driver or 'unknown'}"
                     + (f" (CUDA up to {top})" if top else ""))
        for i, g in enumerate(h.gpus):
            lines.append(f"  gpu {i:<7} {g.name}, {sm_name(g.sm)} "
                         f"(compute capability {arch_cc(g.sm)})")
        lines.append(f"  read from   {h.gpu_source}")
    else:
        lines.append(f"  gpu         none found ({h.gpu_note or 'no NVIDIA GPU'})")
    lines.append(f"  glibc       {glibc_text(h.glibc) if h.glibc else 'unknown'} ({h.machine})")
    if h.grace:
        lines.append(f"  platform    {h.machine}: a Grace host ({h.grace}); "
                     "wheels must be *_aarch64")
    lines.append(f"  variant     {h.variant or '-'}")
    if report.index:
        lines.append(f"index {report.index}")
    for c in report.choices:
        lines.append("")
        for w in c.warnings:
            lines.append(f"WARNING {c.project}: {w}")
        if c.install:
            lines.append(f"{c.project}: {c.wheel}")
            lines.append(f"  {c.install}")
        else:
            lines.append(f"{c.project}: no wheel fits: {c.why}")
    for w in report.warnings:
        lines.append(f"WARNING {w}")
    return "\n".join(lines)
