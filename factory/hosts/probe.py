"""Reading a GPU host, for the doctor: the interpreter it installs into and that interpreter's
torch, the NVIDIA driver and GPUs, glibc and the CPU, into a frozen ``HostInfo``. Nothing is
decided here (``factory.hosts.choose`` does that).

torch is probed in a subprocess (``python -c``) so a broken torch install (a missing CUDA
library, an ABI mismatch) is reported instead of crashing the doctor, and so the doctor reads
the interpreter the host installs into, not its own: by default the ``python3`` on PATH (an
activated venv's, else the system's), or ``--python``.
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
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from factory.errors import CellError, UsageError
from factory.matrix.cell import arch_cc, parse_platform
from factory.matrix.manylinux import glibc_text, host_glibc
from factory.tomlread import tomllib

_TORCH_MARK = "FACTORY-DOCTOR:"
_TORCH_PROBE = f"""
import json, sys
out = {{"python": "%d.%d" % sys.version_info[:2], "implementation": sys.implementation.name}}
try:
    import torch
    out["torch"] = str(torch.__version__)
    out["torch_cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
except BaseException as exc:
    first = str(exc).splitlines()[0] if str(exc) else ""
    out["torch_error"] = "%s: %s" % (type(exc).__name__, first)
print({_TORCH_MARK!r} + json.dumps(out))
"""
# Grace superchips by GPU name: "NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA GB10".
_GRACE_RE = re.compile(r"\bG[BH]\d{2,3}\b", re.IGNORECASE)
_SMI_LINE = re.compile(
    r"^\s*(?P<name>[^,]+?)\s*,\s*(?P<cc>\d+\.\d+)\s*,\s*(?P<driver>\d+(?:\.\d+)+)\s*$"
)
NVIDIA_SMI_QUERY = ("--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader")
# Where the interpreter the doctor reads came from, for its messages.
PYTHON_FROM_PATH = "the python3 on PATH"
PYTHON_FROM_OPTION = "--python"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    sm: int  # compute capability 9.0 -> 90


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostInfo:
    python: str  # "3.11"
    python_exe: str
    python_source: str  # PYTHON_FROM_PATH, PYTHON_FROM_OPTION, or where else it came from
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
        # optional: nvidia-ml-py, not a dependency
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
            proc = subprocess.run(
                [smi, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=60
            )
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
        proc = subprocess.run(
            [python_exe, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=300
        )
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
    return {
        "torch_error": f"{python_exe} exited with {proc.returncode} while importing torch: {last}"
    }


def host_machine(raw: str | None = None) -> str:
    """platform.machine() in wheel-tag spelling ('arm64' -> 'aarch64', 'AMD64' -> 'x86_64')."""
    raw = platform.machine() if raw is None else raw
    try:
        return parse_platform(raw or "x86_64")
    except CellError:
        return raw.lower()


def default_python() -> tuple[str, str]:
    """(interpreter, where it came from): the ``python3`` on PATH, the one a host's
    ``pip install`` goes into; the doctor's own only when there is none."""
    found = shutil.which("python3")
    if found:
        return found, PYTHON_FROM_PATH
    return sys.executable, "the doctor's own (no python3 on PATH)"


def read_host(*, python_exe: str | None = None, nvidia_smi_output: Path | None = None,
              machine: str | None = None) -> HostInfo:
    if python_exe:
        exe, python_source = python_exe, PYTHON_FROM_OPTION
    else:
        exe, python_source = default_python()
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
        python=str(probe.get("python") or "{}.{}".format(*sys.version_info[:2])),
        python_exe=exe,
        python_source=python_source,
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


# -- driver -> CUDA --------------------------------------------------------------------------
@functools.cache
def driver_table() -> dict[str, str]:
    text = importlib.resources.files("factory.data").joinpath("driver_cuda.toml").read_text()
    return dict(tomllib.loads(text)["minimum_driver"])


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def driver_max_cuda(driver: str) -> str | None:
    """The newest CUDA release whose minimum driver this driver meets ('580.95.05' -> '13.0')."""
    have = version_tuple(driver)
    ok = [c for c, need in driver_table().items() if version_tuple(need) <= have]
    return max(ok, key=version_tuple) if ok else None


def driver_runs_cuda(driver: str, cuda: str) -> bool:
    """Minor-version compatibility: the X.0 minimum covers every X.Y (cubin-only wheels)."""
    major = cuda.split(".")[0]
    minimum = driver_table().get(f"{major}.0")
    if minimum is None:
        return False
    return version_tuple(driver) >= version_tuple(minimum)
