"""The GitHub Actions workflows: actionlint finds nothing, and the parts the operations rely on
are there (schedule, the missing-cells matrix, per-cell concurrency shared with one-off
requests, secrets only through env)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ops_builds import REPO, factory_cli, planned, publish_build, write_matrix

WORKFLOWS = REPO / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))


def _actionlint() -> str:
    exe = shutil.which("actionlint")
    if exe is None:
        pytest.fail("actionlint is not on PATH: 'pip install -e .[test]' installs it")
    return exe


def _lint(cwd: Path, *files: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([_actionlint(), "-no-color", "-format", "{{json .}}", *map(str, files)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr  # 1: findings; anything else: actionlint failed
    return list(json.loads(proc.stdout or "[]"))


def _load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the bare key `on` as true
    return dict(doc)


def test_the_three_workflows_exist() -> None:
    assert {p.name for p in FILES} >= {"nightly.yml", "request.yml", "ci.yml"}


def test_actionlint_finds_nothing() -> None:
    findings = _lint(REPO, *FILES)
    assert findings == [], "\n".join(f"{f['filepath']}:{f['line']}: {f['message']}" for f in findings)


def test_actionlint_does_find_mistakes(tmp_path: Path) -> None:
    # Guards the test above against a linter that silently checks nothing.
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: [self-hosted, mem-999g]\n"
        "    steps:\n      - run: echo ${{ matrix.nope }}\n"
    )
    messages = " ".join(f["message"] for f in _lint(tmp_path, bad))
    assert "mem-999g" in messages and "\"nope\" is not defined" in messages


def test_nightly_refreshes_the_lock_before_it_schedules() -> None:
    jobs = _load("nightly.yml")["jobs"]
    lock = jobs["lock"]
    assert lock["permissions"] == {"contents": "write"}
    run = " ".join(s.get("run", "") for s in lock["steps"])
    assert "factory lock | tee lock.txt" in run and "GITHUB_STEP_SUMMARY" in run
    assert "git add matrix.lock" in run and 'git push -q origin "HEAD:$BRANCH"' in run
    schedule = jobs["schedule"]
    assert schedule["needs"] == "lock"
    checkout = schedule["steps"][0]
    assert checkout["with"]["ref"] == "${{ needs.lock.outputs.ref || github.sha }}"
    build_checkout = jobs["build"]["steps"][0]
    assert build_checkout["with"]["ref"] == "${{ needs.schedule.outputs.ref }}"


def test_nightly_schedules_missing_cells_one_job_per_builder() -> None:
    doc = _load("nightly.yml")
    assert doc["on"]["schedule"][0]["cron"] and "workflow_dispatch" in doc["on"]
    jobs = doc["jobs"]
    schedule_run = " ".join(s.get("run", "") for s in jobs["schedule"]["steps"])
    assert "schedule --missing --store" in schedule_run and "--builders" in schedule_run
    build = jobs["build"]
    assert build["needs"] == "schedule"
    assert build["strategy"]["matrix"]["include"] == (
        "${{ fromJSON(needs.schedule.outputs.builders) }}")
    assert build["runs-on"][0] == "self-hosted" and "${{ matrix.builder }}" in build["runs-on"]
    assert build["concurrency"]["group"] == "factory-builder-${{ matrix.builder }}"
    assert build["concurrency"]["cancel-in-progress"] is False
    build_run = " ".join(s.get("run", "") for s in build["steps"])
    assert "factory.ci builder-slots" in build_run
    assert '--cache --publish' in build_run and '--memory "$memory" --cpus "$cpus"' in build_run
    index = jobs["index"]
    assert set(index["needs"]) == {"schedule", "build"}
    assert index["concurrency"]["group"] == "factory-index"
    assert 'factory index rebuild --store "$FACTORY_STORE"' in " ".join(s.get("run", "") for s in index["steps"])


def test_builder_slots_prints_one_line_per_slot() -> None:
    doc = {"version": 1, "builders": [
        {"name": "a", "slots": [{"memory": "65536m", "cpus": 16, "cells": ["x-cp311", "x-cp312"]},
                                {"memory": "65536m", "cpus": 16, "cells": []}]},
        {"name": "b", "slots": [{"memory": "1024m", "cpus": 2, "cells": ["y"]}]}]}
    r = subprocess.run([sys.executable, "-m", "factory.ci", "builder-slots", "a"],
                       input=json.dumps(doc), capture_output=True, text=True, cwd=REPO,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["65536m 16 x-cp311 x-cp312"]


def test_request_shares_the_per_cell_group_and_has_typed_inputs() -> None:
    doc = _load("request.yml")
    inputs = doc["on"]["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"spec", "torch", "cuda", "arch", "python"}
    # the matrix's rules, not a hand list of versions: resolved by the resolve job
    assert all(inputs[k]["type"] == "string" for k in ("spec", "torch", "cuda", "arch", "python"))
    assert inputs["torch"]["default"] == "latest" and inputs["cuda"]["default"] == "default"
    steps = doc["jobs"]["request"]["steps"]
    env = next(s["env"] for s in steps if "factory request" in s.get("run", ""))
    assert env["TORCH"] == "${{ needs.resolve.outputs.torch }}"
    assert env["CUDA"] == "${{ needs.resolve.outputs.cuda }}"
    group = doc["jobs"]["request"]["concurrency"]["group"]
    assert group.split("${{")[0] == "factory-publish-"
    assert group.endswith("${{ needs.resolve.outputs.cell }}")


def test_ci_runs_the_ci_script() -> None:
    doc = _load("ci.yml")
    assert {"push", "pull_request"} <= set(doc["on"])
    assert any(".ci/run" in s.get("run", "") for s in doc["jobs"]["test"]["steps"])


def _walk(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    if isinstance(node, dict):
        return [x for k, v in node.items() for x in _walk(v, (*path, str(k)))]
    if isinstance(node, list):
        return [x for i, v in enumerate(node) for x in _walk(v, (*path, str(i)))]
    return [(path, str(node))]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_secrets_only_through_env_never_in_scripts(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    for where, value in _walk(doc):
        if "secrets." in value:
            assert where[-2] == "env", f"{path.name}: secret used outside env: at {'/'.join(where)}"
        if where[-1] == "run":
            assert "secrets." not in value and "AWS_SECRET_ACCESS_KEY" not in value


def test_the_nightly_matrix_step_output(tmp_path: Path) -> None:
    """What the matrix job feeds to fromJSON: the real CLI, then the runner labels."""
    cells = planned(write_matrix(tmp_path))
    store = tmp_path / "store"
    publish_build(store, tmp_path / "dist", cells[0])
    r = factory_cli("matrix", "--matrix", str(tmp_path / "matrix.toml"), "--missing", "--json",
                    "--store", str(store))
    assert r.returncode == 0, r.stderr
    labelled = subprocess.run([sys.executable, "-m", "factory.ci", "runner-labels"], input=r.stdout,
                              capture_output=True, text=True, cwd=REPO, timeout=60)
    assert labelled.returncode == 0, labelled.stderr
    include = json.loads(labelled.stdout)["include"]
    assert [e["cell"] for e in include] == [c.cell.id for c in cells[1:]]
    assert {e["runner"] for e in include} == {"mem-256g"}  # flash-attn builders
