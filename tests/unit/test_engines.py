"""The engines' jobs from the work model: Slurm batch scripts (their #SBATCH lines are the
plan's), Kubernetes Jobs (valid against the Kubernetes schemas, resources equal to the plan's),
and the names both accept. sbatch, squeue and kubectl are stand-ins here (the real Slurm runs
in tests/integration/test_slurm.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate as kv
import pytest
import yaml

from factory.cli import main
from factory.engines import kubernetes, slurm
from factory.engines.job import JobCommand, job_name
from factory.matrix.load import load_matrix
from factory.planning.memory_model import MemoryHistory, shipped_history_path
from factory.planning.work import plan_work
from factory.units import GIB

REPO = Path(__file__).resolve().parents[2]
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

MATRIX = """
[axes]
torch = ["2.13.0", "2.14.1"]
cuda = ["13.0"]
archs = [["9.0"], ["10.0"], ["8.0", "9.0", "10.0", "12.0"]]
python = ["3.11", "3.12"]

[packages.flash-attn]
recipe = "flash-attn"
versions = ["2.8.3.post2"]

[[include]]
package = "flash-attn"
torch = "2.14.1"
cuda = "13.0"
archs = ["10.0"]
python = "3.11"
platform = "aarch64"
"""


def work(memory: int = 256 * GIB, cpus: int = 64, text: str = MATRIX):  # type: ignore[no-untyped-def]
    return plan_work(load_matrix(text=text).cells, memory=memory, cpus=cpus,
                     history=MemoryHistory.load(shipped_history_path()))


COMMAND = JobCommand(matrix="/srv/factory/matrix.toml", store="s3://wheels/prod")


def test_job_names_are_dns_labels_and_unique() -> None:
    names = [job_name(g) for g in work().groups]
    assert len(set(names)) == len(names) == 7
    for n in names:
        assert len(n) <= 63 and DNS_LABEL.match(n), n
    assert any("aarch64" in n for n in names)


def test_a_slurm_script_asks_for_the_plan_and_runs_the_group_in_one_allocation(
        tmp_path: Path) -> None:
    w = work()
    opts = slurm.SlurmOptions(log_dir=tmp_path / "logs", workdir=tmp_path, partition="gpu-build",
                              extra=("--qos=low",))
    scripts = slurm.write_scripts(w, tmp_path / "jobs", COMMAND, opts)
    assert len(scripts) == len(w.groups) and (tmp_path / "logs").is_dir()
    for g, path in zip(w.groups, scripts, strict=True):
        text = path.read_text()
        subprocess.run(["bash", "-n", str(path)], check=True)  # valid shell
        sbatch = dict(ln[len("#SBATCH --"):].split("=", 1) for ln in text.splitlines()
                      if ln.startswith("#SBATCH --"))
        assert sbatch["mem"] == f"{-(-g.memory_bytes // 2**20)}M"
        # --mem and --time from the tops of the planner's own ranges (flash-attn's recorded
        # runs), not from fixed spreads around its points
        assert g.ranges_from == "planner"
        assert int(sbatch["mem"][:-1]) * 2**20 >= g.peak_bytes[1]  # the range's high end
        assert sbatch["cpus-per-task"] == str(g.cpus)
        assert sbatch["constraint"] == g.machine
        assert sbatch["output"] == f"{tmp_path / 'logs'}/%x-%j.out"
        assert sbatch["partition"] == "gpu-build" and sbatch["qos"] == "low"
        h, m, s = (int(x) for x in sbatch["time"].split(":"))
        assert (h * 60 + m) * 60 + s >= g.time_limit_seconds > g.seconds[1]
        # every cell of the group in one factory build, in the group's order
        run = next(ln for ln in text.splitlines() if ln.startswith("exec "))
        argv = run.split()[1:]
        assert argv[:2] == ["factory", "build"] and argv[2:2 + len(g.cells)] == list(g.cells)
        assert {"--runner", "local", "--publish", "--cache"} <= set(argv)
    submit = (tmp_path / "jobs" / "submit.sh").read_text().splitlines()
    assert [ln.split()[-1] for ln in submit if ln.startswith("sbatch")] == [
        p.name for p in scripts]  # longest first


def _stand_ins(bin_dir: Path, *, queued: str = "") -> Path:
    """sbatch and squeue that log their arguments; squeue lists ``queued``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = bin_dir / "calls.log"
    (bin_dir / "sbatch").write_text(
        f'#!/bin/sh\necho "sbatch $*" >> {log}\necho "sbatch: warning: a note"\n'
        f'echo "$(( $(wc -l < {log}) + 4000 ));cluster"\n')
    (bin_dir / "squeue").write_text(f'#!/bin/sh\necho "squeue $*" >> {log}\nprintf "{queued}"\n')
    (bin_dir / "kubectl").write_text(f'#!/bin/sh\necho "kubectl $*" >> {log}\n'
                                     'echo "job.batch/x created"\n')
    for name in ("sbatch", "squeue", "kubectl"):
        (bin_dir / name).chmod(0o755)
    return log


def test_submit_skips_a_group_whose_job_is_queued(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    w = work()
    opts = slurm.SlurmOptions(log_dir=tmp_path / "logs", workdir=tmp_path)
    scripts = slurm.write_scripts(w, tmp_path / "jobs", COMMAND, opts)
    queued = job_name(w.groups[1])
    log = _stand_ins(tmp_path / "bin", queued=f"{queued}\\nsomeone-elses-job\\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    done = slurm.submit(w, scripts)
    assert [d.job_id is None for d in done] == [i == 1 for i in range(len(w.groups))]
    assert all(d.job_id and d.job_id.isdigit() for d in done if d.job_name != queued)
    calls = log.read_text().splitlines()
    assert calls[0] == "squeue --noheader --me --format=%j"
    assert [c.split()[-1] for c in calls[1:]] == [str(p) for i, p in enumerate(scripts) if i != 1]


def test_cli_emits_and_submits_slurm_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    log = _stand_ins(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "matrix.toml").write_text(MATRIX)
    rc = main(["schedule", "--matrix", str(tmp_path / "matrix.toml"), "--memory", "128g",
               "--cpus", "32", "--emit", "slurm", "--out", str(tmp_path / "jobs"), "--submit",
               "--store", "s3://wheels/prod", "--lease-ttl", "120", "--build-arg=--uncapped",
               "--factory", "/opt/factory/bin/python -m factory"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("submitted ") == 7
    assert len(log.read_text().splitlines()) == 8  # squeue once, sbatch per group
    text = next((tmp_path / "jobs").glob("*.sbatch")).read_text()
    run = next(ln for ln in text.splitlines() if ln.startswith("exec "))
    assert run.startswith("exec /opt/factory/bin/python -m factory build ")
    assert f"--matrix {tmp_path / 'matrix.toml'}" in run
    assert run.endswith("--store s3://wheels/prod --cache --lease-ttl 120 --uncapped")


def test_kubernetes_jobs_for_the_default_matrix_validate_and_ask_for_the_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "k8s"
    args = ["schedule", "--matrix", str(REPO / "matrix.toml"), "--memory", "256g",
            "--cpus", "64"]
    assert main([*args, "--json"]) == 0
    planned = {g["id"]: g for g in json.loads(capsys.readouterr().out)["groups"]}
    assert main([*args, "--emit", "kubernetes", "--out", str(out), "--image",
                 "registry.example.com/factory:1", "--namespace", "wheels",
                 "--store", "s3://wheels/prod"]) == 0
    # the CUDA 12.8 cell's toolkit comes in a builder image: no job for the local runner
    printed = capsys.readouterr().out
    (cu128,) = [i for i, g in planned.items() if "-cu128-" in g["cells"][0]]
    assert f"refused {planned.pop(cu128)['name']}: CUDA 12.8 comes in image" in printed
    files = sorted(out.glob("*.yaml"))
    # every other group gets a job; the ones whose CUDA comes in a builder image are refused
    refused = {i for i, g in planned.items() if f"refused {g['name']}: CUDA" in printed}
    assert len(files) == len(planned) - len(refused) > 0
    seen = set()
    for f in files:
        doc = yaml.safe_load(f.read_text())
        kv.utils.validate(doc, kv.utils.latest_version(), strict=True)  # raises when invalid
        group = planned[doc["metadata"]["labels"][kubernetes.GROUP_LABEL]]
        seen.add(group["id"])
        pod = doc["spec"]["template"]["spec"]
        (box,) = pod["containers"]
        want = {"cpu": str(group["cpus"]), "memory": f"{-(-group['memory_bytes'] // 2**20)}Mi"}
        assert box["resources"] == {"requests": want, "limits": want}
        assert pod["nodeSelector"] == {"kubernetes.io/arch": {"x86_64": "amd64",
                                                              "aarch64": "arm64"}[group["machine"]]}
        assert box["envFrom"] == [{"secretRef": {"name": "factory-store"}}]
        assert box["command"][:2 + len(group["cells"])] == ["factory", "build", *group["cells"]]
        assert "--uncapped" in box["command"] and "--publish" in box["command"]
        assert 0 <= doc["spec"]["activeDeadlineSeconds"] - group["time_limit_seconds"] <= 1
        # the planner's ranges; a package with no recorded object times has no time range
        assert group["ranges_from"] == ("planner" if group["name"].startswith(
            ("flash-attn", "factory-example-ext")) else "fixed spread for the time")
        assert doc["metadata"]["namespace"] == "wheels"
        assert len(doc["metadata"]["name"]) <= 63
    assert seen == set(planned) - refused


def test_a_broken_manifest_is_refused_by_the_schema() -> None:
    """The validation above can fail: a Job with requests as a list does not pass."""
    g = work().groups[0]
    doc = kubernetes.job(g, COMMAND, kubernetes.KubernetesOptions(image="x"))
    doc["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = ["4"]
    with pytest.raises(kv.utils.ValidationError):
        kv.utils.validate(doc, kv.utils.latest_version(), strict=True)


def test_apply_hands_the_files_to_kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    log = _stand_ins(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "matrix.toml").write_text(MATRIX)
    out = tmp_path / "k8s"
    assert main(["schedule", "--matrix", str(tmp_path / "matrix.toml"), "--memory", "128g",
                 "--cpus", "32", "--emit", "kubernetes", "--out", str(out), "--image", "img",
                 "--apply"]) == 0
    assert "job.batch/x created" in capsys.readouterr().out
    (call,) = log.read_text().splitlines()
    assert call.startswith("kubectl apply -f ")
    assert sorted(call.split(" -f ")[1:]) == sorted(str(p) for p in out.glob("*.yaml"))
    assert call.count(" -f ") == 7


@pytest.mark.parametrize("value", [
    "plain", "with: colon", "- dash", "#hash", "'quote\"", "multi\nline", "", "yes", "1.0",
    "null", "{brace}", "ünïcode",
])
def test_yaml_strings_cannot_change_the_documents_shape(value: str) -> None:
    doc = {"a": value, "list": [value, {"k": value, "n": 3}], "kubernetes.io/arch": value,
           "empty": {}, "none": [], "flag": True}
    assert yaml.safe_load(kubernetes.to_yaml(doc)) == doc


def test_emit_actions_writes_the_static_schedule_nightly_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "matrix.toml").write_text(MATRIX)
    args = ["schedule", "--matrix", str(tmp_path / "matrix.toml"), "--builders",
            str(REPO / ".github" / "builders.toml")]
    assert main([*args, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert main([*args, "--emit", "actions", "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "schedule.json").read_text())
    assert written == printed and written["include"]
    assert "schedule.json: " in capsys.readouterr().out
