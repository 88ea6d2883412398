"""The budget comes from the cgroup (v1 and v2) when one caps the build, never the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.planning.budget import detect_budget
from factory.planning.cgroup import cpu_limit, memory_limit, own_dirs
from factory.units import GIB

HOST_MEMINFO = "MemTotal: 263000000 kB\nMemFree: 1000 kB\nMemAvailable: 262000000 kB\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def meminfo(tmp_path: Path) -> Path:
    return write(tmp_path / "meminfo", HOST_MEMINFO)


def test_v2_limits_of_one_dir(tmp_path: Path, meminfo: Path) -> None:
    cg = tmp_path / "cg"
    write(cg / "memory.max", "17179869184\n")
    write(cg / "cpu.max", "400000 100000\n")
    assert memory_limit(cg) == 16 * GIB
    assert cpu_limit(cg) == 4.0
    b = detect_budget(cg, meminfo=meminfo, affinity=64)
    assert (b.memory_bytes, b.cpus) == (16 * GIB, 4)
    assert "cgroup" in b.memory_source and "cgroup" in b.cpus_source


def test_v2_max_means_unlimited_so_host_available_is_used(tmp_path: Path, meminfo: Path) -> None:
    cg = tmp_path / "cg"
    write(cg / "memory.max", "max\n")
    write(cg / "cpu.max", "max 100000\n")
    assert memory_limit(cg) is None
    assert cpu_limit(cg) is None
    b = detect_budget(cg, meminfo=meminfo, affinity=12)
    assert b.memory_bytes == 262000000 * 1024
    assert b.cpus == 12
    assert "no cgroup memory limit" in b.memory_source


def test_v1_limits_of_one_dir(tmp_path: Path, meminfo: Path) -> None:
    cg = tmp_path / "cg"
    write(cg / "memory.limit_in_bytes", str(8 * GIB))
    write(cg / "cpu.cfs_quota_us", "150000")
    write(cg / "cpu.cfs_period_us", "100000")
    assert memory_limit(cg) == 8 * GIB
    assert cpu_limit(cg) == 1.5
    b = detect_budget(cg, meminfo=meminfo, affinity=8)
    # 1.5 CPUs round down: two compilers on 1.5 CPUs are throttled, not faster.
    assert (b.memory_bytes, b.cpus) == (8 * GIB, 1)


def test_v1_absurd_limit_and_no_quota_are_unlimited(tmp_path: Path, meminfo: Path) -> None:
    cg = tmp_path / "cg"
    write(cg / "memory.limit_in_bytes", "9223372036854771712")
    write(cg / "cpu.cfs_quota_us", "-1")
    write(cg / "cpu.cfs_period_us", "100000")
    assert memory_limit(cg) is None
    assert cpu_limit(cg) is None
    b = detect_budget(cg, meminfo=meminfo, affinity=3)
    assert b.cpus == 3 and b.memory_bytes == 262000000 * 1024


def test_limit_above_host_available_is_capped_by_host(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    write(cg / "memory.max", str(512 * GIB))
    small = write(tmp_path / "meminfo", "MemTotal: 8388608 kB\nMemAvailable: 4194304 kB\n")
    b = detect_budget(cg, meminfo=small, affinity=2)
    assert b.memory_bytes == 4 * GIB
    assert "below the cgroup limit" in b.memory_source


def test_quota_above_affinity_uses_affinity(tmp_path: Path, meminfo: Path) -> None:
    cg = tmp_path / "cg"
    write(cg / "cpu.max", "1600000 100000")
    assert detect_budget(cg, meminfo=meminfo, affinity=2).cpus == 2


def test_own_v2_cgroup_takes_the_tightest_ancestor(tmp_path: Path, meminfo: Path) -> None:
    root = tmp_path / "sys"
    leaf = root / "build.slice" / "job.scope"
    write(root / "build.slice" / "memory.max", str(12 * GIB))
    write(root / "build.slice" / "cpu.max", "max 100000")
    write(leaf / "memory.max", "max")
    write(leaf / "cpu.max", "300000 100000")
    proc_cgroup = write(tmp_path / "cgroup", "0::/build.slice/job.scope\n")
    mem_dirs, cpu_dirs = own_dirs(proc_cgroup, root)
    assert mem_dirs[0] == leaf and mem_dirs[-1] == root
    b = detect_budget(proc_cgroup=proc_cgroup, cgroup_root=root, meminfo=meminfo, affinity=16)
    assert (b.memory_bytes, b.cpus) == (12 * GIB, 3)
    assert "build.slice" in b.memory_source


def test_own_v2_cgroup_inside_a_container_falls_back_to_the_mount(tmp_path: Path,
                                                                  meminfo: Path) -> None:
    # The path names the host's hierarchy, which the container does not see.
    root = tmp_path / "sys"
    write(root / "memory.max", str(6 * GIB))
    write(root / "cpu.max", "200000 100000")
    proc_cgroup = write(tmp_path / "cgroup", "0::/system.slice/docker-abc.scope\n")
    b = detect_budget(proc_cgroup=proc_cgroup, cgroup_root=root, meminfo=meminfo, affinity=16)
    assert (b.memory_bytes, b.cpus) == (6 * GIB, 2)


def test_own_v1_cgroup_reads_memory_and_cpu_hierarchies(tmp_path: Path, meminfo: Path) -> None:
    root = tmp_path / "sys"
    write(root / "memory" / "docker" / "abc" / "memory.limit_in_bytes", str(10 * GIB))
    write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712")
    write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "400000")
    write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000")
    proc_cgroup = write(
        tmp_path / "cgroup",
        "12:memory:/docker/abc\n5:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n",
    )
    b = detect_budget(proc_cgroup=proc_cgroup, cgroup_root=root, meminfo=meminfo, affinity=32)
    assert (b.memory_bytes, b.cpus) == (10 * GIB, 4)


def test_no_cgroup_at_all_uses_host_available(tmp_path: Path, meminfo: Path) -> None:
    b = detect_budget(proc_cgroup=tmp_path / "missing", cgroup_root=tmp_path / "none",
                      meminfo=meminfo, affinity=5)
    assert (b.memory_bytes, b.cpus) == (262000000 * 1024, 5)


def test_detect_budget_on_this_host_is_sane() -> None:
    b = detect_budget()
    assert b.memory_bytes > 0 and b.cpus >= 1


def test_resolve_budget_given_figures_win() -> None:
    from factory.planning.budget import resolve_budget

    b = resolve_budget(3 * GIB, 7, memory_label="--memory", cpus_label="--cpus")
    assert (b.memory_bytes, b.cpus) == (3 * GIB, 7)
    assert (b.memory_source, b.cpus_source) == ("--memory", "--cpus")
    half = resolve_budget(3 * GIB, None, memory_label="--memory")
    assert half.memory_bytes == 3 * GIB and half.cpus >= 1 and half.cpus_source != "given"
