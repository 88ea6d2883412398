"""Every host-side read of the cgroup file system, v1 and v2: where cgroups are, their limits,
their memory peak and their OOM-kill counter.

Users: the planner's budget (this process's own limits), the docker runner (the container's
cgroup seen from the host) and the local runner (the build cgroup it made). The build's own
side, ``runners/inside/``, runs in the container's python and keeps its own stdlib-only reader.

A directory is read the same way whatever its version: the v2 file first, else the v1 file
(a directory has only one of them), so callers need not know which hierarchy they hold.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
PROC_MOUNTS = Path("/proc/self/mounts")

# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX rounded to pages (9223372036854771712 on
# x86_64); anything this large is not a limit anyone set.
_ABSURD_BYTES = 1 << 60


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _keyed(path: Path, key: str) -> int | None:
    """The value of ``key`` in a 'key value' file (memory.events, memory.oom_control, ...)."""
    for ln in (_read(path) or "").splitlines():
        k, _, v = ln.partition(" ")
        if k == key and v.strip().isdigit():
            return int(v)
    return None


def _number(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text and text.isdigit() else None


# -- where cgroups are --------------------------------------------------------------------------


def mounts(proc_mounts: Path = PROC_MOUNTS) -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of the cgroup file systems (v1 and v2)."""
    out = []
    for ln in (_read(proc_mounts) or "").splitlines():
        parts = ln.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1], parts[2], set(parts[3].split(","))))
    return out


def _membership_lines(proc_cgroup: Path) -> list[tuple[str, str]]:
    """(controllers, path) per line of /proc/<pid>/cgroup; controllers '' is v2's unified line."""
    out = []
    for ln in (_read(proc_cgroup) or "").splitlines():
        parts = ln.split(":", 2)
        if len(parts) == 3:
            out.append((parts[1], parts[2]))
    return out


def membership(proc_cgroup: Path = PROC_CGROUP) -> dict[str, str]:
    """controller -> this process's path in that hierarchy ('' key: the v2 unified path)."""
    out: dict[str, str] = {}
    for ctrls, path in _membership_lines(proc_cgroup):
        for c in ctrls.split(",") if ctrls else [""]:
            out[c] = path
    return out


def _ancestors(leaf: Path, root: Path) -> list[Path]:
    """leaf, its parent, ... up to and including root (a limit anywhere above binds too)."""
    out = [leaf]
    cur = leaf
    while cur != root and root in cur.parents:
        cur = cur.parent
        out.append(cur)
    return out


def own_dirs(
    proc_cgroup: Path = PROC_CGROUP, root: Path = ROOT
) -> tuple[list[Path], list[Path]]:
    """(memory dirs, cpu dirs) from leaf to root for the current process, v2 or v1 layout.

    Inside a container the path in /proc/self/cgroup names the host's hierarchy while the
    container sees its own cgroup mounted at the root; a path that does not exist under the
    mount therefore falls back to the mount itself.
    """
    memory: list[Path] = []
    cpu: list[Path] = []
    for controllers, rel in _membership_lines(proc_cgroup):
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


def limiting_memory_dir(proc_cgroup: Path = PROC_CGROUP, root: Path = ROOT) -> Path | None:
    """The nearest cgroup on this process's path up to the root that sets a memory limit: the
    allocation a Slurm job or a Kubernetes pod runs in. None: no limit anywhere."""
    memory, _ = own_dirs(proc_cgroup, root)
    return next((d for d in memory if memory_limit(d) is not None), None)


def container_dirs(container_id: str, root: Path = ROOT) -> list[Path]:
    """A docker container's memory cgroup seen from the host (cgroupfs or systemd driver, v1
    or v2); it exists only while the container runs."""
    candidates = [
        root / "memory" / "docker" / container_id,  # v1, cgroupfs driver
        root / "memory" / "system.slice" / f"docker-{container_id}.scope",  # v1, systemd
        root / "system.slice" / f"docker-{container_id}.scope",  # v2, systemd
        root / "docker" / container_id,  # v2, cgroupfs
    ]
    found = [c for c in candidates if c.is_dir()]
    if not found:
        # Docker nested in another cgroup (a CI sandbox): search one level of parents.
        found = [p for p in root.glob(f"memory/*/docker/{container_id}") if p.is_dir()]
        found += [p for p in root.glob(f"*/docker/{container_id}") if p.is_dir()]
    return found


# -- what one cgroup directory says -------------------------------------------------------------


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


def memory_limit(cgroup_dir: Path) -> int | None:
    """The memory limit set on exactly this cgroup directory (v2 or v1), None when unlimited."""
    v2 = _limit_bytes(cgroup_dir / "memory.max")
    return v2 if v2 is not None else _limit_bytes(cgroup_dir / "memory.limit_in_bytes")


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


def cpu_limit(cgroup_dir: Path) -> float | None:
    """CPUs the CFS quota on exactly this directory allows (1.5 = 150 %); None: unlimited."""
    v2 = _v2_cpu(cgroup_dir)
    return v2 if v2 is not None else _v1_cpu(cgroup_dir)


def memory_peak(cgroup_dir: Path) -> int | None:
    """The cgroup's peak memory (v2 memory.peak, v1 memory.max_usage_in_bytes). Page cache
    counts: it is not what the compilers used (runners/inside/sampling.py measures that)."""
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        value = _number(cgroup_dir / name)
        if value is not None:
            return value
    return None


def oom_kills(cgroup_dir: Path) -> int | None:
    """Processes the OOM killer took in this cgroup so far (v2 memory.events, v1
    memory.oom_control); None where the kernel keeps no counter."""
    for name in ("memory.events", "memory.oom_control"):
        value = _keyed(cgroup_dir / name, "oom_kill")
        if value is not None:
            return value
    return None
