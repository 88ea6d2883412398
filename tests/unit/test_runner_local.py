"""The local runner: a cgroup-capped build on this host, no docker. These builds need no
compiler (pure-Python packages and a memory hog), so they are cheap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from runner_fixtures import cgroups_or_skip, probe_job, probe_package

from factory.errors import EngineError
from factory.planning import cgroup
from factory.runners import get_runner, local

REPO = Path(__file__).resolve().parents[2]


def _leftover_cgroups() -> list[Path]:
    found = []
    mine = cgroup.membership()
    for mp, fs, opts in cgroup.mounts():
        for ctrl in [o for o in opts if o in ("memory", "cpu", "pids")] if fs == "cgroup" else [""]:
            for parent in {Path(mp), Path(mp) / mine.get(ctrl, "/").lstrip("/")}:
                found += [
                    d for d in parent.glob(f"{local.CGROUP_PREFIX}*{os.getpid()}*") if d.is_dir()
                ]
    return found


def test_cgroup_gets_the_caps_and_goes_away() -> None:
    cgroups_or_skip()
    cg = local.Cgroup.create(memory=512 << 20, cpus=1.5, pids=100)
    try:
        if cg.version == 1:
            mem = cg.dirs["memory"]
            assert int((mem / "memory.limit_in_bytes").read_text()) == 512 << 20
            if (mem / "memory.memsw.limit_in_bytes").exists():  # no swap: memsw equals memory
                assert int((mem / "memory.memsw.limit_in_bytes").read_text()) == 512 << 20
            if "cpu" in cg.dirs:
                assert int((cg.dirs["cpu"] / "cpu.cfs_quota_us").read_text()) == 150000
        else:
            d = cg.dirs["unified"]
            assert int((d / "memory.max").read_text()) == 512 << 20
            assert (d / "cpu.max").read_text().split()[0] == "150000"
    finally:
        cg.remove()
    assert not any(d.exists() for d in cg.dirs.values())


def test_local_build_under_a_cap(tmp_path: Path) -> None:
    cgroups_or_skip()
    src = probe_package(tmp_path)
    lines: list[str] = []
    result = get_runner("local", mode="existing", interpreter=sys.executable).run(
        probe_job(tmp_path, src), on_line=lines.append
    )
    assert result.exit_code == 0, result.log_path.read_text()[-3000:]
    assert result.wheel is not None and result.wheel.name == "probe-0.1-py3-none-any.whl"
    assert not result.oom_killed and result.oom_kill_count == 0
    assert result.cgroup_peak_bytes and result.cgroup_peak_bytes > 0
    assert result.report["exit_code"] == 0
    assert any("Successfully built probe" in ln for ln in lines)
    assert "Successfully built probe" in result.log_path.read_text()
    assert not _leftover_cgroups()


def test_local_oom_is_reported_as_oom(tmp_path: Path) -> None:
    cgroups_or_skip()
    # The build backend writes 1 GiB under a 256 MiB cap with no swap: the kernel kills it.
    src = probe_package(tmp_path, "hog = b'x' * (1 << 30)\n")
    result = get_runner("local", mode="existing", interpreter=sys.executable).run(
        probe_job(tmp_path, src, memory=256 << 20)
    )
    assert result.exit_code != 0
    assert result.oom_killed is True
    assert result.oom_kill_count and result.oom_kill_count >= 1
    assert result.wheel is None
    assert not _leftover_cgroups()


def test_refuses_without_cgroups_unless_told_uncapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cgroup, "mounts", lambda: [])
    src = probe_package(tmp_path)
    runner = get_runner("local", mode="existing", interpreter=sys.executable)
    with pytest.raises(EngineError) as info:
        runner.run(probe_job(tmp_path, src))
    assert "\n" not in info.value.message and "--uncapped" in (info.value.tip or "")

    result = get_runner("local", mode="existing", interpreter=sys.executable, uncapped=True).run(
        probe_job(tmp_path, src, memory=None)
    )
    assert result.exit_code == 0 and result.wheel is not None
    assert result.cgroup_peak_bytes is None and result.oom_kill_count is None


def test_uncapped_in_an_allocation_its_oom_counter_is_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod or a Slurm job where the runner may not make a cgroup: the allocation's own
    counter says whether a compiler was OOM-killed (then the build retries with fewer jobs);
    a failure without a kill there is a failure."""
    allocation = tmp_path / "job_7"
    allocation.mkdir()
    counter = allocation / "memory.oom_control"
    counter.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    monkeypatch.setattr(cgroup, "limiting_memory_dir", lambda: allocation)
    runner = get_runner("local", mode="existing", interpreter=sys.executable, uncapped=True)
    # the kernel kills a compiler in the allocation: its counter rises by one
    killed = probe_package(tmp_path / "a", f"""
        open({str(counter)!r}, "w").write("oom_kill_disable 0\\nunder_oom 0\\noom_kill 5\\n")
        raise SystemExit(1)
        """)
    result = runner.run(probe_job(tmp_path / "a", killed, memory=None))
    assert result.exit_code != 0 and result.oom_killed and result.oom_kill_count == 1
    failed = probe_package(tmp_path / "b", "raise SystemExit(1)\n")  # the counter stays at 5
    result = runner.run(probe_job(tmp_path / "b", failed, memory=None))
    assert result.exit_code != 0 and not result.oom_killed and result.oom_kill_count == 0


def test_describe_shows_the_caps_and_the_mode(tmp_path: Path) -> None:
    runner = get_runner("local", mode="system-site", interpreter=sys.executable)
    job = probe_job(tmp_path, tmp_path / "src")
    d = runner.describe(job)
    assert d["memory_limit_bytes"] == 1 << 30 and d["pids_limit"] == 512
    assert d["inside_job"]["system_site_packages"] is True
    assert d["inside_job"]["venv"].endswith("venv-local-cp" + job.python.replace(".", ""))


def _pids_with(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def test_kill9_of_the_factory_leaves_no_process_and_no_cgroup(tmp_path: Path) -> None:
    cgroups_or_skip()
    marker = f"{600 + uuid.uuid4().int % 1000}.{os.getpid()}"  # a unique 'sleep' argument
    probe_package(tmp_path, f"import subprocess; subprocess.run(['sleep', '{marker}'])\n")
    driver = tmp_path / "driver.py"
    driver.write_text(
        textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from factory.runners import BuildJob, get_runner
        root = Path({str(tmp_path)!r})
        job = BuildJob(cell_id="probe-0.1", python="{sys.version_info[0]}.{sys.version_info[1]}",
                       src_dir=root / "src", out_dir=root / "out", wheelhouse=root / "wh",
                       cuda_home=None, requirements=(), memory_limit_bytes=1 << 30, cpus=1,
                       log_path=root / "logs" / "build.log")
        get_runner("local", mode="existing", interpreter=sys.executable).run(job)
    """)
    )
    parent = subprocess.Popen([sys.executable, str(driver)], start_new_session=True)
    try:
        for _ in range(600):
            if _pids_with(marker):
                break
            time.sleep(0.1)
        assert _pids_with(marker), "the build never started"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        # inside.py sees its stdin close and kills the build: nothing waits for a later run.
        for _ in range(300):
            if not _pids_with(marker):
                break
            time.sleep(0.1)
        assert not _pids_with(marker), "the build outlived the factory"
        removed = local.cleanup_stale_cgroups()
        assert any(str(parent.pid) in p.name for p in removed)
        assert not [d for d in removed if d.exists()]
    finally:
        for pid in _pids_with(marker):
            os.kill(pid, signal.SIGKILL)
        local.cleanup_stale_cgroups()


