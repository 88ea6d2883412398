"""The matrix on a real single-node Slurm (tests/slurm_fixtures.py): `factory schedule --emit
slurm --submit` puts one job per group in the queue with the plan's --mem, --cpus-per-task,
--time and the CPU as a constraint; each job runs `factory build --runner local --publish`
inside its allocation (the planner reads the job's cgroup limit) against S3 on loopback. A
job cancelled mid-cell releases its lease (SIGTERM unwinds the build), the next submission
of what is missing rebuilds that cell (resuming its tree), and every cell is built once,
published and installable."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import index_fixtures
import pytest
from engine_builds import (
    ARCHS_SLURM,
    BUILD_ARGS,
    assert_installable,
    built_counts,
    cell_ids,
    engine_matrix,
    published_versions,
    wheel_version,
)
from slurm_fixtures import Slurm, slurm_cluster

from factory.store import open_store
from factory.units import MIB, format_size, parse_size

moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec

pytestmark = pytest.mark.slow


@pytest.fixture
def slurm() -> Iterator[Slurm]:
    with slurm_cluster() as cluster:
        yield cluster


def _factory(*args: str, env: dict[str, str], cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "factory", *args], env={**os.environ, **env},
                          cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _submitted(out: str) -> dict[str, str]:
    """job name -> job id, from the 'submitted NAME as job ID' lines."""
    return dict(re.findall(r"^submitted (\S+) as job (\d+)$", out, re.MULTILINE))


def _log(jobs: Path, name: str, job_id: str) -> Path:
    return jobs / "logs" / f"{name}-{job_id}.out"


def test_slurm_builds_each_cell_once_and_a_cancelled_jobs_cell_is_built_by_the_next(
        slurm: Slurm, tmp_path: Path, s3_spec: str, s3_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A history of this test's own: the plans (and so --mem, the job order and which job is
    # cancelled) must not depend on what the builds of earlier tests recorded.
    monkeypatch.setenv("FACTORY_MEMORY_HISTORY", str(tmp_path / "memory_history.json"))
    matrix = engine_matrix(tmp_path / "matrix.toml", ARCHS_SLURM)
    jobs = tmp_path / "jobs"
    env = {**s3_env, **slurm.env}
    schedule = ["schedule", "--matrix", str(matrix), "--missing", "--store", s3_spec,
                "--memory", "6g", "--cpus", "1"]
    emit = [*schedule, "--emit", "slurm", "--out", str(jobs), "--submit", "--chdir",
            str(tmp_path), "--factory", f"{sys.executable} -m factory", "--lease-ttl", "60",
            *(f"--build-arg={a}" for a in BUILD_ARGS)]
    plan = {g["id"]: g for g in json.loads(_factory(*schedule, "--json", env=env,
                                                    cwd=tmp_path))["groups"]}
    first = _submitted(_factory(*emit, env=env, cwd=tmp_path))
    assert len(first) == 4  # one group per cell: one Python here
    queued = slurm.queue()
    assert set(first.values()) <= set(queued)  # the groups are queued at once
    assert list(queued.values()).count("RUNNING") <= 2  # 2 CPUs, a CPU each

    # each job asks Slurm for its group's plan
    for job_id in first.values():
        info = slurm.job(job_id)
        g = plan[info["Comment"].removeprefix("cuda-wheel-factory:")]
        # scontrol prints the request in its own units (3584M as "3.50G", to two decimals)
        assert abs(parse_size(info["MinMemoryNode"]) - parse_size(g["memory"])) <= 10.24 * MIB, info
        assert info["NumCPUs"] == str(g["cpus"]) == "1"
        assert info["Features"] == "x86_64"
        h, m, s = (int(x) for x in info["TimeLimit"].split(":"))
        assert 0 <= (h * 60 + m) * 60 + s - g["time_limit_seconds"] <= 61, info["TimeLimit"]

    # cancel one job while its cell compiles
    victim = victim_id = None
    deadline = time.monotonic() + 1800
    while victim is None:
        assert time.monotonic() < deadline, "no job started compiling"
        slurm.check_launches()
        for name, job_id in first.items():
            path = _log(jobs, name, job_id)
            if path.exists() and "attempt 1:" in path.read_text():
                victim, victim_id = name, job_id
                break
        time.sleep(2)
    time.sleep(20)  # well into its compile
    slurm.run("scancel", victim_id)
    slurm.wait_empty(timeout=3600)
    assert slurm.job(victim_id)["JobState"] == "CANCELLED"
    victim_log = _log(jobs, victim, victim_id).read_text()
    assert "ERROR terminated (signal 15)" in victim_log  # SIGTERM unwound the build
    (victim_group,) = [g for g in plan.values() if victim.endswith(g["id"][:9])]
    lease = open_store(s3_spec).read(f"leases/{victim_group['content_keys'][0]}.json")
    assert lease is not None and json.loads(lease)["expires"] == 0.0  # released, not left

    # the next submission of what is missing: the cancelled job's group only
    again = _submitted(_factory(*emit, env=env, cwd=tmp_path))
    assert list(again) == [victim]
    slurm.wait_empty(timeout=3600)
    assert slurm.job(again[victim])["JobState"] == "COMPLETED"
    rebuilt = _log(jobs, victim, again[victim]).read_text()
    assert "source tree kept from an earlier run (resume)" in rebuilt

    logs = [p.read_text() for p in sorted((jobs / "logs").glob("*.out"))]
    counts = built_counts(logs)
    assert counts == {c: 1 for c in cell_ids(ARCHS_SLURM)}, counts  # each cell built once
    versions = [wheel_version(a) for a in ARCHS_SLURM]
    assert published_versions(s3_spec) == {v: 1 for v in versions}
    # the planner read the allocation's own limit (its group's --mem), not the host's memory
    for path in sorted((jobs / "logs").glob("*.out")):
        text = path.read_text()
        if "attempt 1:" not in text:
            continue
        job_id = path.stem.rsplit("-", 1)[1]
        group = re.search(r"^factory: job \d+ on \S+, group (\S+)$", text, re.MULTILINE)
        assert group, text[:500]
        size = re.escape(format_size(parse_size(plan[group[1]]["memory"])))
        assert re.search(rf"budget: {size} \(cgroup limit \(\S*slurm_\S+/job_{job_id}\b",
                         text), text[-3000:]
        assert "1 CPU(s) (CPU affinity of this process)" in text
    assert_installable(s3_spec, tmp_path, versions)
