"""The memory and CPU budget a build can really use.

A container or a systemd slice caps memory and CPU through its cgroup; the host's totals
(``os.cpu_count()``, ``MemTotal``) are what flash-attn's own setup.py reads, and that is how a
capped build gets OOM-killed. So: the cgroup's limit when there is one (v2 ``memory.max`` /
``cpu.max``, v1 ``memory.limit_in_bytes`` / ``cpu.cfs_quota_us``), the tightest one on the path
up to the cgroup root, and the host's figures only as an upper bound.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from factory.errors import UsageError
from factory.matrix.settings import Settings
from factory.planning import cgroup
from factory.units import parse_size


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget:
    memory_bytes: int
    cpus: int
    memory_source: str  # a phrase: where the figure came from
    cpus_source: str

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _tightest(dirs: list[Path], read: object) -> tuple[float | None, Path | None]:
    best: float | None = None
    where: Path | None = None
    for d in dirs:
        value = read(d)  # type: ignore[operator]
        if value is not None and (best is None or value < best):
            best, where = value, d
    return best, where


def _meminfo(meminfo: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = meminfo.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key] = int(fields[0]) * 1024
    return out


def detect_budget(
    cgroup_dir: Path | None = None,
    *,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    meminfo: Path = Path("/proc/meminfo"),
    affinity: int | None = None,
) -> Budget:
    """The budget of ``cgroup_dir`` (one directory, as a runner sees a container's cgroup) or,
    when None, of the current process (its cgroup and every ancestor)."""
    if cgroup_dir is not None:
        mem_dirs = cpu_dirs = [cgroup_dir]
    else:
        mem_dirs, cpu_dirs = cgroup.own_dirs(proc_cgroup, cgroup_root)

    info = _meminfo(meminfo)
    # MemAvailable is what the host can still give; it is only an upper bound on a cgroup limit.
    host_free = info.get("MemAvailable") or info.get("MemTotal")
    limit, where = _tightest(mem_dirs, cgroup.memory_limit)
    if limit is not None and (host_free is None or limit <= host_free):
        memory = int(limit)
        memory_source = f"cgroup limit ({where})"
    elif host_free is not None:
        memory = host_free
        memory_source = (
            "host MemAvailable (below the cgroup limit)" if limit is not None
            else "host MemAvailable (no cgroup memory limit)"
        )
    else:
        raise UsageError("cannot read the memory budget (no cgroup limit, no /proc/meminfo)",
                         tip="pass --memory SIZE")

    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = os.cpu_count() or 1
    quota, cpu_where = _tightest(cpu_dirs, cgroup.cpu_limit)
    if quota is not None and quota < affinity:
        # Round down: a 1.5-CPU quota cannot keep two compilers busy without throttling them.
        cpus = max(1, math.floor(quota))
        cpus_source = f"cgroup CPU quota {quota:g} ({cpu_where})"
    else:
        cpus = max(1, affinity)
        cpus_source = "CPU affinity of this process"
    return Budget(memory_bytes=memory, cpus=cpus, memory_source=memory_source,
                  cpus_source=cpus_source)


def resolve_budget(memory: int | None, cpus: int | None, *, memory_label: str = "given",
                   cpus_label: str = "given") -> Budget:
    """Given figures win; whatever is None is detected from this process's cgroup."""
    if memory is not None and cpus is not None:
        return Budget(memory_bytes=memory, cpus=cpus, memory_source=memory_label,
                      cpus_source=cpus_label)
    found = detect_budget()
    if memory is not None:
        found = dataclasses.replace(found, memory_bytes=memory, memory_source=memory_label)
    if cpus is not None:
        found = dataclasses.replace(found, cpus=cpus, cpus_source=cpus_label)
    return found


@dataclasses.dataclass(frozen=True, kw_only=True)
class BudgetRequest:
    """The figures a plan is asked to fit; None: detect it from this process's cgroup when the
    plan is made. The sources say where given figures came from (e.g. "--memory")."""

    memory: int | None = None  # bytes
    cpus: int | None = None
    memory_source: str = "given"
    cpus_source: str = "given"

    def resolve(self) -> Budget:
        return resolve_budget(self.memory, self.cpus, memory_label=self.memory_source,
                              cpus_label=self.cpus_source)


def requested_budget(settings: Settings, *, memory: str | None = None,
                     cpus: int | None = None) -> BudgetRequest:
    """``--memory``/``--cpus``, else ``[settings] memory``/``cpus``, else detected: every command
    that plans (plan, build, request) starts here, so the same cell and flags plan alike.
    ``--memory auto`` asks for detection even where the settings give a size."""
    if cpus is not None and cpus < 1:
        raise UsageError(f"--cpus must be at least 1, not {cpus}")
    if memory is not None:
        mem, mem_source = (None if memory in ("", "auto") else parse_size(memory)), "--memory"
    else:
        mem, mem_source = settings.memory, "[settings] memory"
    if cpus is None:
        cpus, cpus_source = settings.cpus, "[settings] cpus"
    else:
        cpus_source = "--cpus"
    return BudgetRequest(memory=mem, cpus=cpus, memory_source=mem_source, cpus_source=cpus_source)
