"""Slurm: one batch job per group, its cells in order in one allocation (they hit its compile
cache), asking for what the work model predicts.

``--mem`` is the high end of the predicted peak, ``--cpus-per-task`` the CPUs the plan keeps
busy, ``--time`` the high end of the predicted time plus the setup allowance
(``planning.work``), ``--constraint`` the wheels' CPU (give the nodes the feature ``x86_64``
or ``aarch64``). The job runs ``factory build ... --runner local --publish`` (engines.job):
inside the allocation the planner reads the job's own cgroup limit, and the cells are
claimed through the store's leases, so a job killed or run twice never builds a cell twice.
Logs go where Slurm users look (``--output``); ``factory build`` ends with one summary line
per cell. ``submit`` skips groups that already have a job of this user in the queue, so a
nightly can submit again safely: only what is missing and not queued goes in.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from factory.engines.job import JobCommand, job_name
from factory.errors import EngineError, UsageError
from factory.planning.work import Work, WorkGroup, memory_arg
from factory.process import find_program, run_program
from factory.units import format_size


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    log_dir: Path  # --output goes here (absolute: jobs start elsewhere)
    workdir: Path  # --chdir
    partition: str | None = None
    account: str | None = None
    extra: tuple[str, ...] = ()  # more #SBATCH lines' options, as given ("--qos=low")


def slurm_time(seconds: float) -> str:
    """``--time`` in Slurm's ``D-HH:MM:SS`` (whole minutes, rounded up)."""
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


def script(group: WorkGroup, command: JobCommand, opts: SlurmOptions) -> str:
    name = job_name(group)
    lo, hi = group.seconds
    directives = [
        f"--job-name={name}",
        f"--comment=cuda-wheel-factory:{group.id}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={group.cpus}",
        f"--mem={memory_arg(group.memory_bytes)}",
        f"--time={slurm_time(group.time_limit_seconds)}",
        f"--constraint={group.machine}",
        f"--output={opts.log_dir / '%x-%j.out'}",
        f"--chdir={opts.workdir}",
    ]
    if opts.partition:
        directives.append(f"--partition={opts.partition}")
    if opts.account:
        directives.append(f"--account={opts.account}")
    directives += list(opts.extra)
    for d in directives:  # sbatch splits #SBATCH lines at white space, quotes or not
        if any(ch.isspace() for ch in d):
            raise UsageError(f"a Slurm option with white space in it: {d!r}",
                             tip="use paths without spaces for --log-dir and --chdir")
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        f"# factory work group {group.id}: {group.name}",
        f"# {len(group.cells)} cell(s) in build order, one allocation (the later ones take the "
        "first one's kernels from the compile cache):",
        *(f"#   {c}" for c in group.cells),
        f"# predicted: peak {format_size(group.peak_bytes[0])}-{format_size(group.peak_bytes[1])}"
        f" (asked {format_size(group.memory_bytes)}), MAX_JOBS={group.max_jobs} "
        f"NVCC_THREADS={group.nvcc_threads} on {group.cpus} CPU(s), {lo / 60:.0f}-{hi / 60:.0f}"
        f" min (limit: the high end + the setup allowance)",
        "set -euo pipefail",
        'echo "factory: job ${SLURM_JOB_ID:-?} on $(hostname), group ' + group.id + '"',
        "exec " + command.shell(group),
        "",
    ]
    return "\n".join(lines)


def write_scripts(work: Work, out: Path, command: JobCommand, opts: SlurmOptions
                  ) -> list[Path]:
    """One ``<job name>.sbatch`` per group (longest first) and ``submit.sh`` that submits them
    in that order; the log directory is made (Slurm does not make it)."""
    out.mkdir(parents=True, exist_ok=True)
    opts.log_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for g in work.groups:
        p = out / f"{job_name(g)}.sbatch"
        _write(p, script(g, command, opts))
        paths.append(p)
    submit = ["#!/bin/bash", "# the groups longest first; each prints its job id",
              "set -euo pipefail", 'cd "$(dirname "$0")"',
              *(f"sbatch --parsable {shlex.quote(p.name)}" for p in paths), ""]
    _write(out / "submit.sh", "\n".join(submit), mode=0o755)
    return paths


def _write(path: Path, text: str, *, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def queued_names() -> set[str]:
    """The names of this user's jobs in the queue (pending or running)."""
    squeue = find_program("squeue", tip="run on a Slurm login node (slurm-client)")
    out = run_program([squeue, "--noheader", "--me", "--format=%j"], what="squeue",
                      error=EngineError, timeout=60).stdout
    return {ln.strip() for ln in out.splitlines() if ln.strip()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Submitted:
    group: str
    job_name: str
    job_id: str | None  # None: a job of that name was queued already


def submit(work: Work, scripts: Sequence[Path]) -> list[Submitted]:
    """``sbatch`` each group's script, longest first, unless a job of its name is queued."""
    sbatch = find_program("sbatch", tip="run on a Slurm login node (slurm-client)")
    queued = queued_names()
    out = []
    for g, path in zip(work.groups, scripts, strict=True):
        name = job_name(g)
        if name in queued:
            out.append(Submitted(group=g.name, job_name=name, job_id=None))
            continue
        text = run_program([sbatch, "--parsable", str(path)], what="sbatch", error=EngineError,
                           timeout=120).stdout
        # --parsable prints "ID" or "ID;CLUSTER"; warnings may come before it
        ids = [ln.split(";")[0] for ln in text.split() if ln.split(";")[0].isdigit()]
        if not ids:
            raise EngineError(f"sbatch {path.name}: no job id in its output: {text.strip()}")
        out.append(Submitted(group=g.name, job_name=name, job_id=ids[-1]))
    return out
