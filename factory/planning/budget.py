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
from typing import TYPE_CHECKING

from factory.errors import UsageError
from factory.units import parse_size

if TYPE_CHECKING:
    from factory.matrix.settings import Settings

# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX rounded to pages (9223372036854771712 on
# x86_64); anything this large is not a limit anyone set.
_ABSURD_BYTES = 1 << 60


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget:
    memory_bytes: int
    cpus: int
    memory_source: str  # a phrase: where the figure came from
    cpus_source: str

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _limit_bytes(path: Path) -> int | None:
    """A memory limit file's value; None for "max" (v2), an absurd v1 value, or no file."""
    text = _read(path)
    if text is None or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < _ABSURD_BYTES else None


def _v2_cpu(d: Path) -> float | None:
    text = _read(d / "cpu.max")
    if not text:
        return None
    parts = text.split()
    if parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_cpu(d: Path) -> float | None:
    quota_text = _read(d / "cpu.cfs_quota_us")
    period_text = _read(d / "cpu.cfs_period_us")
    if quota_text is None or period_text is None:
        return None
    try:
        quota, period = int(quota_text), int(period_text)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None  # -1: no quota


def cgroup_memory_limit(cgroup_dir: Path) -> int | None:
    """The memory limit set on exactly this cgroup directory (v2 or v1), None when unlimited."""
    v2 = _limit_bytes(cgroup_dir / "memory.max")
    return v2 if v2 is not None else _limit_bytes(cgroup_dir / "memory.limit_in_bytes")


def cgroup_cpu_limit(cgroup_dir: Path) -> float | None:
    """CPUs the CFS quota on exactly this directory allows (1.5 = 150 %); None: unlimited."""
    v2 = _v2_cpu(cgroup_dir)
    return v2 if v2 is not None else _v1_cpu(cgroup_dir)


def _ancestors(leaf: Path, root: Path) -> list[Path]:
    """leaf, its parent, ... up to and including root (a limit anywhere above binds too)."""
    out = [leaf]
    cur = leaf
    while cur != root and root in cur.parents:
        cur = cur.parent
        out.append(cur)
    return out


def _tightest(dirs: list[Path], read: object) -> tuple[float | None, Path | None]:
    best: float | None = None
    where: Path | None = None
    for d in dirs:
        value = read(d)  # type: ignore[operator]
        if value is not None and (best is None or value < best):
            best, where = value, d
    return best, where


def own_cgroup_dirs(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> tuple[list[Path], list[Path]]:
    """(memory dirs, cpu dirs) from leaf to root for the current process, v2 or v1 layout.

    Inside a container the path in /proc/self/cgroup names the host's hierarchy while the
    container sees its own cgroup mounted at the root; a path that does not exist under the
    mount therefore falls back to the mount itself.
    """
    text = _read(proc_cgroup) or ""
    memory: list[Path] = []
    cpu: list[Path] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        names = set(controllers.split(",")) if controllers else set()
        rel = rel.lstrip("/")
        if not controllers:  # v2 unified hierarchy: "0::/user.slice/..."
            mount = root
            leaf = mount / rel if (mount / rel).is_dir() else mount
            dirs = _ancestors(leaf, mount)
            memory += dirs
            cpu += dirs
            continue
        for ctl, target in (("memory", memory), ("cpu", cpu)):
            if ctl not in names:
                continue
            mount = next(
                (m for m in (root / controllers, root / ctl) if m.is_dir()), root / ctl
            )
            leaf = mount / rel if (mount / rel).is_dir() else mount
            target += _ancestors(leaf, mount)
    return memory, cpu


def _meminfo(meminfo: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (_read(meminfo) or "").splitlines():
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
        mem_dirs, cpu_dirs = own_cgroup_dirs(proc_cgroup, cgroup_root)

    info = _meminfo(meminfo)
    # MemAvailable is what the host can still give; it is only an upper bound on a cgroup limit.
    host_free = info.get("MemAvailable") or info.get("MemTotal")
    limit, where = _tightest(mem_dirs, cgroup_memory_limit)
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
    quota, cpu_where = _tightest(cpu_dirs, cgroup_cpu_limit)
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
