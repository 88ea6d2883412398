"""The GitHub Actions workflows: actionlint finds nothing, and the parts the operations rely on
are there (schedule, the missing-cells matrix, per-cell concurrency shared with one-off
requests, secrets only through env)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ops_builds import REPO, factory_cli
from tools import tool

from factory.ci import cpu_label
from factory.planning.builders import Builder

WORKFLOWS = REPO / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))


def _actionlint() -> str:
    return tool("actionlint")


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
    assert "factory lock 2>&1 | tee lock.txt" in run and "GITHUB_STEP_SUMMARY" in run
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


# How a Linux runner starts a step's script: GitHub's default shell, and `shell: bash`.
SHELLS = {None: ["bash", "-e", "-c"], "bash": ["bash", "--noprofile", "--norc", "-eo",
                                                 "pipefail", "-c"]}


def _run_job(steps: list[dict[str, Any]], fake_bin: Path, *, cwd: Path | None = None,
             env_extra: dict[str, str] | None = None) -> tuple[bool, list[str]]:
    """The job's run steps in order as a runner takes them: each in its shell (bash -e, or
    bash -eo pipefail for ``shell: bash``), a failed step skips the later ones unless it has
    continue-on-error, and ``if: steps.ID.outcome == 'failure'`` runs a step only when that
    step failed. Returns whether the job failed and the name of each step that ran."""
    outcomes: dict[str, str] = {}
    failed, ran = False, []
    env = {**os.environ, "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
           "FACTORY_STORE": "s3://bucket/x", "KEEP": "3", **(env_extra or {})}
    for step in steps:
        if "run" not in step:
            continue
        condition = str(step.get("if", ""))
        if condition:
            ident = condition.split("steps.", 1)[1].split(".", 1)[0]
            if outcomes.get(ident) != "failure":
                continue
        elif failed:
            continue
        ran.append(step["name"])
        proc = subprocess.run([*SHELLS[step.get("shell")], step["run"]], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=60)
        outcomes[step.get("id", step["name"])] = "success" if proc.returncode == 0 else "failure"
        if proc.returncode != 0 and not step.get("continue-on-error"):
            failed = True
    return failed, ran


def test_nightly_rebuilds_the_index_even_when_retention_fails(tmp_path: Path) -> None:
    """retain fails (exit 11): the rebuild and the verify still run, and the job fails after."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "factory").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" = retain ] && exit 11\nexit 0\n'
    )
    (fake / "factory").chmod(0o755)
    steps = _load("nightly.yml")["jobs"]["index"]["steps"]
    failed, _ = _run_job([s for s in steps if "install" not in s.get("name", "")], fake)
    commands = [line.split()[0:2] for line in calls.read_text().splitlines()]
    assert commands == [["retain", "--store"], ["index", "rebuild"], ["index", "verify"],
                        ["matrix", "--html"]]
    assert failed, "the job must fail when retention failed"
    calls.unlink()
    (fake / "factory").write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexit 0\n')
    failed, _ = _run_job([s for s in steps if "install" not in s.get("name", "")], fake)
    assert not failed and len(calls.read_text().splitlines()) == 4


def test_nightly_lock_step_fails_with_the_lock_and_summarises_its_diff(tmp_path: Path) -> None:
    """The lock step as a runner runs it, in a checkout with a committed matrix.lock: a lock
    that fails (exit 12, its error on stderr) fails the step although tee succeeds, and its
    error is in the summary; a lock that changes the file puts its table and the file's diff
    (fenced) in the summary and says changed=true."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    (repo / "matrix.lock").write_text("cell = 1\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "matrix.lock"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "lock"], check=True)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "factory").write_text(
        '#!/bin/sh\nif [ -n "$FAIL" ]; then echo "ERROR cannot reach pypi.org" >&2; exit 12; fi\n'
        'echo "cell = 2" > matrix.lock\necho "change  c  torch 2.14.0 -> 2.14.1"\n')
    (fake / "factory").chmod(0o755)
    step = next(s for s in _load("nightly.yml")["jobs"]["lock"]["steps"] if s.get("id") == "lock")

    def run(**env: str) -> tuple[bool, str, str]:
        summary, output = tmp_path / "summary.md", tmp_path / "output"
        summary.write_text("")
        output.write_text("")
        failed, _ = _run_job([step], fake, cwd=repo, env_extra={
            "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output), **env})
        return failed, summary.read_text(), output.read_text()

    failed, summary, output = run(FAIL="1")
    assert failed, "a failing 'factory lock' must fail the step (pipefail)"
    assert "ERROR cannot reach pypi.org" in summary and "changed=" not in output
    failed, summary, output = run()
    assert not failed and output == "changed=true\n"
    assert "```\nchange  c  torch 2.14.0 -> 2.14.1\n```" in summary
    assert "matrix.lock | 2 +-" in summary
    assert "```diff\ndiff --git a/matrix.lock b/matrix.lock" in summary
    assert "-cell = 1\n+cell = 2\n```" in summary


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
    assert set(inputs) == {"spec", "torch", "cuda", "arch", "python", "platform"}
    assert inputs["platform"]["options"] == ["x86_64", "aarch64"]
    # the matrix's rules, not a hand list of versions: resolved by the resolve job
    assert all(inputs[k]["type"] == "string" for k in ("spec", "torch", "cuda", "arch", "python"))
    assert inputs["torch"]["default"] == "latest" and inputs["cuda"]["default"] == "default"
    steps = doc["jobs"]["request"]["steps"]
    env = next(s["env"] for s in steps if "factory request" in s.get("run", ""))
    assert env["TORCH"] == "${{ needs.resolve.outputs.torch }}"
    assert env["CUDA"] == "${{ needs.resolve.outputs.cuda }}"
    assert env["PLATFORM"] == "${{ inputs.platform }}"
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


BUILDERS = REPO / ".github" / "builders.toml"
_EXPR = re.compile(r"\$\{\{\s*([\w.-]+)\s*\}\}")


def _builder_jobs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "factory.ci", "builder-jobs", "--builders",
                        str(BUILDERS)], input=json.dumps(doc), capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout))


def _request_runners() -> list[dict[str, str]]:
    """What request.yml's resolve job outputs for a one-off request of each package of the
    default matrix, for each CPU: the real CLI, as the workflow runs it."""
    from factory.matrix.cell import PLATFORMS
    from factory.matrix.load import load_matrix

    out = []
    cells = [pc.cell for pc in load_matrix(REPO / "matrix.toml").cells]
    for package in dict.fromkeys(c.package for c in cells):
        for platform in PLATFORMS:
            # a cell of the matrix for that CPU (a torch build exists there), else the
            # package's first one asked for on that CPU
            c = next((c for c in cells if c.package == package and c.platform == platform),
                     next(c for c in cells if c.package == package))
            r = factory_cli("request", f"{c.package}=={c.version}", "--torch", c.torch,
                            "--cuda", c.cuda, "--arch", ",".join(f"{a / 10:.1f}" for a in c.archs),
                            "--python", c.python, "--platform", platform, "--print-cell",
                            "--json", "--builders", str(BUILDERS))
            assert r.returncode == 0, r.stderr
            doc = json.loads(r.stdout)
            out.append({"needs.resolve.outputs.runner": doc["runner"],
                        "needs.resolve.outputs.cpu": doc["cpu"], "platform": platform,
                        "package": c.package})
    assert {o["package"] for o in out} >= {"flash-attn", "factory-example-ext"}
    return out


def _builder_labels(builder: Builder) -> frozenset[str]:
    """Every label the builder's self-hosted runner carries (docs/DEPLOY.md)."""
    return frozenset({"self-hosted", "linux", cpu_label(builder.platform), builder.name,
                      *builder.labels})


def test_every_runs_on_label_is_carried_by_a_builder() -> None:
    """Each job of each workflow, with every value its runs-on expressions can take (from the
    builders file, the default matrix's schedule and `factory request` of each package for each
    CPU), lands on a builder of .github/builders.toml that carries all its labels; a job that
    builds a cell lands only on builders that build that cell's platform."""
    from factory.planning.builders import load_builders

    builders = load_builders(BUILDERS)
    # The nightly schedule of the default matrix names builders of the file...
    r = factory_cli("schedule", "--builders", str(BUILDERS), "--matrix", str(REPO / "matrix.toml"),
                    "--json")
    assert r.returncode == 0, r.stderr
    scheduled = _builder_jobs(json.loads(r.stdout))
    assert scheduled and {e["builder"] for e in scheduled} <= {b.name for b in builders}
    # ...and a night's schedule may give work to any of them.
    every = _builder_jobs({"include": [{"builder": b.name, "slots": 1} for b in builders]})
    values: dict[tuple[str, str], list[dict[str, str]]] = {
        ("nightly.yml", "build"): [{"matrix.builder": e["builder"], "matrix.cpu": e["cpu"],
                                    "platform": next(b.platform for b in builders
                                                     if b.name == e["builder"])}
                                   for e in every],
        ("request.yml", "request"): _request_runners(),
    }
    checked = 0
    for path in FILES:
        for name, job in _load(path.name)["jobs"].items():
            runs_on = job["runs-on"]
            assert isinstance(runs_on, list) and runs_on[0] == "self-hosted", (
                f"{path.name} {name}: runs on {runs_on!r}, not on a builder of builders.toml")
            exprs = {m for label in runs_on for m in _EXPR.findall(label)}
            cases = values.get((path.name, name), [{}])
            for case in cases:
                unknown = exprs - set(case)
                assert not unknown, f"{path.name} {name}: no known values for {sorted(unknown)}"
                labels = {_EXPR.sub(lambda m, c=case: c[m.group(1)], label) for label in runs_on}
                carriers = [b for b in builders if labels <= _builder_labels(b)]
                assert carriers, f"{path.name} {name}: no builder carries {sorted(labels)}"
                if "platform" in case:
                    wrong = [b.name for b in carriers if not b.builds(case["platform"])]
                    assert not wrong, (f"{path.name} {name}: {sorted(labels)} can land on "
                                       f"{wrong}, which cannot build {case['platform']} cells")
                checked += 1
    assert checked >= len(FILES) + len(builders)


def test_the_builders_platform_decides_the_cpu_label(tmp_path: Path) -> None:
    builders = tmp_path / "builders.toml"
    builders.write_text('[[builder]]\nname = "grace"\nmemory = "480g"\ncpus = 72\n'
                        'platform = "aarch64"\n[[builder]]\nname = "x"\nmemory = "64g"\n'
                        'cpus = 16\nplatform = "x86_64"\n')
    r = subprocess.run([sys.executable, "-m", "factory.ci", "builder-jobs", "--builders",
                        str(builders)], input='{"include": [{"builder": "grace", "slots": 1}, '
                        '{"builder": "x", "slots": 2}]}', capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [(e["builder"], e["cpu"]) for e in json.loads(r.stdout)] == [
        ("grace", "arm64"), ("x", "x64")]
    # An aarch64 cell goes to the native builder; an x86_64 one to the x86_64 builder.
    from factory.ci import runs_on
    from factory.planning.builders import load_builders

    loaded = load_builders(builders)
    assert runs_on("factory-example-ext", "aarch64", loaded).labels() == [
        "self-hosted", "linux", "arm64", "grace"]
    assert runs_on("factory-example-ext", "x86_64", loaded).labels()[2:] == ["x64", "x"]
    bad = subprocess.run([sys.executable, "-m", "factory.ci", "builder-jobs", "--builders",
                          str(builders)], input='{"include": [{"builder": "gone"}]}',
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode != 0 and bad.stderr.startswith("ERROR the schedule names builder 'gone'")


def test_actionlint_knows_exactly_the_builders_labels() -> None:
    """actionlint's self-hosted label list is the builders' (names and labels), so the lint
    and the builders cannot disagree; the test above is what checks the workflows."""
    from factory.planning.builders import load_builders

    doc = yaml.safe_load((REPO / ".github" / "actionlint.yaml").read_text())
    builders = load_builders(BUILDERS)
    assert set(doc["self-hosted-runner"]["labels"]) == {
        label for b in builders for label in (b.name, *b.labels)}
