"""The work queue for real: three `factory work` processes with different memory caps share one
S3 store (moto on loopback) and build a 6-cell matrix (tests/engine_builds.py: a one-kernel
extension) with the local runner, no cell built twice; one of them is killed (SIGKILL: no
release) while it builds a cell, its leases expire, and another worker takes the group and
builds the cell: nothing is lost.
Before them, a fourth worker whose memory is below what any group needs finds every group
free and takes none of them, saying why for each (no build: it never claims).
The cells' trees are shared with test_slurm (tests/engine_builds.py): a cell one of them built
resumes in the other."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import index_fixtures
import pytest
from engine_builds import (
    ARCHS_QUEUE,
    BUILD_ARGS,
    assert_installable,
    built_counts,
    cell_ids,
    engine_matrix,
    published_versions,
    wheel_version,
)

from factory.store import open_store

moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec

pytestmark = pytest.mark.slow

# each fits one job of the engines' extension (4.8 GiB: the recipe's per-job figure and headroom)
CAPS = (("6g", "1"), ("5500m", "1"), ("5g", "1"))
TOO_SMALL = ("3g", "1")  # below one job: no group fits
TTL = "20"


def test_three_workers_build_six_cells_once_and_a_killed_worker_loses_nothing(
        tmp_path: Path, s3_spec: str, s3_env: dict[str, str]) -> None:
    matrix = engine_matrix(tmp_path / "matrix.toml", ARCHS_QUEUE)
    env = {**os.environ, **s3_env}
    # every group is free, and none fits this worker's memory: it claims none and says why
    small = subprocess.run(
        [sys.executable, "-m", "factory", "work", "--matrix", str(matrix), "--store", s3_spec,
         "--memory", TOO_SMALL[0], "--cpus", TOO_SMALL[1], "--lease-ttl", TTL, "--poll", "5",
         "--out", str(tmp_path / "dist-small"), *BUILD_ARGS],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    said = small.stdout + small.stderr
    assert small.returncode == 0, said
    refusals = [line for line in said.splitlines() if "not for this worker: " in line]
    assert len(refusals) == len(ARCHS_QUEUE), said  # one group per cell here
    assert all("needs at least" in line and "the budget is 3.0 GiB" in line
               for line in refusals), refusals
    assert "0 group(s) built here; nothing left that fits this worker" in said
    assert "claimed " not in said and not built_counts([said])
    assert not list(open_store(s3_spec).list("leases/", sizes=False))  # nothing claimed
    logs = [tmp_path / f"worker-{i}.log" for i in range(len(CAPS))]
    procs = []
    for i, (memory, cpus) in enumerate(CAPS):
        with open(logs[i], "w") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "factory", "work", "--matrix", str(matrix), "--store",
                 s3_spec, "--memory", memory, "--cpus", cpus, "--cache", "--lease-ttl", TTL,
                 "--poll", "5", "--out", str(tmp_path / f"dist-{i}"), *BUILD_ARGS],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path))
    try:
        # kill a worker as soon as one of its cells starts building (the cell's tree may be
        # one an earlier test built: then it resumes, which still takes a minute)
        victim = None
        deadline = time.monotonic() + 1800
        while victim is None:
            assert time.monotonic() < deadline, "no worker started a build"
            assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
            for i, path in enumerate(logs):
                text = path.read_text()
                if "attempt 1:" in text.rsplit("] cell ", 1)[-1]:
                    victim = i
                    break
            time.sleep(0.5)
        killed_cell = logs[victim].read_text().rsplit("] cell ", 1)[-1].split()[0]
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait(timeout=60)
        for i, p in enumerate(procs):
            if i != victim:
                assert p.wait(timeout=3600) == 0, logs[i].read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = [p.read_text() for p in logs]
    heirs = [t for i, t in enumerate(texts) if i != victim]
    counts = built_counts(texts)
    assert counts == {c: 1 for c in cell_ids(ARCHS_QUEUE)}, counts  # each cell built once
    # the killed worker's cell: started there, never finished there, built by another
    assert built_counts([texts[victim]])[killed_cell] == 0
    assert sum(built_counts([t])[killed_cell] for t in heirs) == 1
    versions = [wheel_version(a) for a in ARCHS_QUEUE]
    assert published_versions(s3_spec) == {v: 1 for v in versions}
    assert all("nothing left that fits this worker" in t for t in heirs)
    assert_installable(s3_spec, tmp_path, versions)
