"""Host-side cgroup reads (v1 and v2): where cgroups are, peak memory, the OOM-kill counter.
The limits are covered with the budget (test_budget.py)."""

from __future__ import annotations

from pathlib import Path

from factory.planning import cgroup


def test_v2_oom_kill_counter(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n")
    assert cgroup.oom_kills(tmp_path) == 2


def test_v1_oom_kill_counter(tmp_path: Path) -> None:
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert cgroup.oom_kills(tmp_path) == 3


def test_no_counter_reads_none(tmp_path: Path) -> None:
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")  # old v1
    assert cgroup.oom_kills(tmp_path) is None


def test_peak_v2_and_v1(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir()
    v1.mkdir()
    (v2 / "memory.peak").write_text("4096\n")
    (v1 / "memory.max_usage_in_bytes").write_text("8192\n")
    assert cgroup.memory_peak(v2) == 4096
    assert cgroup.memory_peak(v1) == 8192
    assert cgroup.memory_peak(tmp_path) is None


def test_membership_and_mounts(tmp_path: Path) -> None:
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("4:memory:/a/b\n2:cpu,cpuacct:/c\n0::/u\n")
    assert cgroup.membership(proc_cgroup) == {"memory": "/a/b", "cpu": "/c", "cpuacct": "/c",
                                              "": "/u"}
    proc_mounts = tmp_path / "mounts"
    proc_mounts.write_text(
        "proc /proc proc rw 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
    )
    assert cgroup.mounts(proc_mounts) == [
        ("/sys/fs/cgroup/memory", "cgroup", {"rw", "relatime", "memory"}),
        ("/sys/fs/cgroup/unified", "cgroup2", {"rw", "relatime"}),
    ]


def test_container_dirs_v2_systemd_and_nested(tmp_path: Path) -> None:
    scope = tmp_path / "system.slice" / "docker-abc.scope"
    scope.mkdir(parents=True)
    assert cgroup.container_dirs("abc", tmp_path) == [scope]
    nested = tmp_path / "memory" / "sandbox" / "docker" / "def"
    nested.mkdir(parents=True)
    assert cgroup.container_dirs("def", tmp_path) == [nested]
    assert cgroup.container_dirs("none", tmp_path) == []


def test_the_limiting_dir_is_the_nearest_one_with_a_memory_limit(tmp_path: Path) -> None:
    """A Slurm job: the limit sits on job_N, the process in job_N/step_batch/task_0."""
    job = tmp_path / "memory" / "slurm_n1" / "uid_0" / "job_7"
    task = job / "step_batch" / "task_0"
    task.mkdir(parents=True)
    for d in (task, task.parent, job.parent, job.parent.parent, tmp_path / "memory"):
        (d / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1: no limit
    (job / "memory.limit_in_bytes").write_text(f"{4 << 30}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/slurm_n1/uid_0/job_7/step_batch/task_0\n")
    assert cgroup.limiting_memory_dir(proc, tmp_path) == job
    (job / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup.limiting_memory_dir(proc, tmp_path) is None
