"""factory schedule --builders FILE | --memory SIZE --cpus N [--emit actions|slurm|kubernetes
--out DIR] [--missing --store STORE] [--package P] [--json | --markdown] [--html FILE]

With ``--builders``: the groups assigned to static builders (what nightly.yml runs on
self-hosted Actions runners), also as Markdown tables (a CI job's step summary) or a page of
the lanes. With ``--memory``/``--cpus`` (the largest allocation a job may ask for): the work
model itself, the groups longest first with what each needs, and with
``--emit slurm|kubernetes`` one job per group written to ``--out`` (``--submit`` / ``--apply``
hands them to the engine).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from factory import actions
from factory.build.pipeline import load_history
from factory.commands._common import add_matrix_arg, matrix_from_args, print_json, store_from_args
from factory.commands.matrix import add_selection_args, selected_cells
from factory.engines import kubernetes, slurm
from factory.engines.job import JobCommand, factory_command, local_runner_work
from factory.errors import UsageError
from factory.planning.builders import load_builders
from factory.planning.schedule import schedule
from factory.planning.work import Work, plan_work
from factory.reports.lanes import lanes_html
from factory.reports.page import write_page
from factory.units import format_duration, format_size, parse_size

ENGINES = ("actions", "slurm", "kubernetes")


def configure(parser: argparse.ArgumentParser) -> None:
    add_matrix_arg(parser)
    add_selection_args(parser)
    parser.add_argument("--builders", type=Path, default=None, metavar="FILE",
                        help="TOML: [[builder]] name, memory, cpus, platform, labels (static "
                        "builders: the Actions way)")
    parser.add_argument("--memory", default=None, metavar="SIZE",
                        help="the largest allocation one job may ask for (Slurm, Kubernetes)")
    parser.add_argument("--cpus", type=int, default=None, metavar="N",
                        help="the most CPUs one job may ask for")
    parser.add_argument("--emit", choices=ENGINES, default=None,
                        help="write the jobs for this engine into --out")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where --emit writes (schedule.json, *.sbatch, *.yaml)")
    jobs = parser.add_argument_group("what the jobs run (slurm, kubernetes)")
    jobs.add_argument("--factory", default="factory", metavar="CMD",
                      help="how a node starts the factory (default: factory)")
    jobs.add_argument("--job-matrix", default=None, metavar="FILE",
                      help="the matrix as a job sees it (default: this matrix's absolute path "
                      "for slurm, matrix.toml in --workdir for kubernetes)")
    jobs.add_argument("--no-cache", action="store_true",
                      help="build without the compile cache")
    jobs.add_argument("--lease-ttl", type=float, default=None, metavar="SECONDS",
                      help="the cells' lease time to live in the jobs' builds")
    jobs.add_argument("--build-arg", action="append", default=[], metavar="TEXT",
                      help="one more argument for the jobs' factory build (repeatable)")
    slurm = parser.add_argument_group("slurm")
    slurm.add_argument("--submit", action="store_true",
                       help="sbatch the groups not queued yet (longest first)")
    slurm.add_argument("--partition", default=None, metavar="NAME",
                       help="the jobs' partition (sbatch --partition)")
    slurm.add_argument("--account", default=None, metavar="NAME",
                       help="the account the jobs are charged to (sbatch --account)")
    slurm.add_argument("--sbatch-option", action="append", default=[], metavar="TEXT",
                       help="one more #SBATCH option, e.g. --qos=low (repeatable)")
    slurm.add_argument("--log-dir", type=Path, default=None, metavar="DIR",
                       help="the jobs' --output directory (default: OUT/logs)")
    slurm.add_argument("--chdir", type=Path, default=None, metavar="DIR",
                       help="the jobs' working directory (default: the current one)")
    parser.add_argument("--markdown", action="store_true",
                        help="with --builders: the schedule as Markdown tables (a CI job's step "
                        "summary)")
    parser.add_argument("--html", metavar="FILE", type=Path, default=None,
                        help="with --builders: also write the lanes (builders, slots, cells over "
                        "time) as a page")
    k8s = parser.add_argument_group("kubernetes")
    k8s.add_argument("--apply", action="store_true", help="kubectl apply the manifests")
    k8s.add_argument("--image", default=None, metavar="IMAGE",
                     help="the pods' image (the factory and this checkout in --workdir)")
    k8s.add_argument("--workdir", default="/srv/factory", metavar="DIR",
                     help="the checkout in the image (default /srv/factory)")
    k8s.add_argument("--secret", default="factory-store", metavar="NAME",
                     help="the Secret with the store's credentials (default factory-store)")
    k8s.add_argument("--namespace", default=None, metavar="NAME",
                     help="the namespace of the Jobs (default: kubectl's current one)")


def run(args: argparse.Namespace) -> int:
    _check(args)
    if args.builders is not None:
        return _static(args)
    return _work(args)


def _check(args: argparse.Namespace) -> None:
    if args.cpus is not None and args.cpus < 1:
        raise UsageError(f"--cpus must be at least 1, not {args.cpus}")
    sized = args.memory is not None or args.cpus is not None
    if args.builders is not None and sized:
        raise UsageError("give --builders (static builders) or --memory/--cpus (one job per "
                         "group), not both")
    if args.builders is None and (args.memory is None or args.cpus is None):
        raise UsageError("give --builders FILE, or --memory SIZE and --cpus N (the largest job)")
    if (args.markdown or args.html is not None) and args.builders is None:
        raise UsageError("--markdown and --html show the static builders' lanes: give "
                         "--builders FILE")
    if args.emit == "actions" and args.builders is None:
        raise UsageError("--emit actions assigns static builders: give --builders FILE")
    if args.emit in ("slurm", "kubernetes") and args.builders is not None:
        raise UsageError(f"--emit {args.emit} makes one job per group: give --memory and --cpus, "
                         "not --builders")
    if args.emit and args.out is None:
        raise UsageError(f"--emit {args.emit} writes files: give --out DIR")
    if args.submit and args.emit != "slurm":
        raise UsageError("--submit goes with --emit slurm")
    if args.apply and args.emit != "kubernetes":
        raise UsageError("--apply goes with --emit kubernetes")
    if args.emit == "kubernetes" and not args.image:
        raise UsageError("--emit kubernetes needs --image (the pods' image)")
    if args.lease_ttl is not None and args.lease_ttl <= 0:
        raise UsageError(f"--lease-ttl must be positive, not {args.lease_ttl:g}")


def _static(args: argparse.Namespace) -> int:

    builders = load_builders(args.builders)
    # the history `factory plan` and `factory build` read: one cell model for all three
    found = schedule(selected_cells(args), builders,
                     history=load_history(matrix_from_args(args)))
    if args.emit == "actions":
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "schedule.json"
        _write_json(path, found.as_dict())
        print(f"wrote {path}: {len(found.as_dict()['include'])} builder job(s)")
        return 0
    if args.html is not None:
        path = write_page(args.html, lanes_html(found.as_dict()))
        if not (args.json or args.markdown):
            print(f"lanes page: {path}")
    if args.json:
        print_json(found.as_dict())
        return 0
    if args.markdown:
        print(schedule_markdown(found.as_dict()), end="")
        return 0
    for line in found.lines():
        print(line)
    return 0


def schedule_markdown(doc: dict[str, Any]) -> str:
    """``factory schedule --json`` as Markdown: one row per slot, then the makespan."""
    rows = []
    for b in doc["builders"]:
        for slot in b["slots"]:
            if slot["cells"]:
                rows.append([b["name"], slot["slot"], format_size(slot["memory_bytes"]),
                             slot["cpus"], len(slot["cells"]),
                             format_duration(slot["predicted_seconds"]),
                             " ".join(f"`{c}`" for c in slot["cells"])])
    out = [f"### factory schedule: {sum(r[4] for r in rows)} cell(s) on "
           f"{len({r[0] for r in rows})} builder(s)\n",
           actions.markdown_table(["builder", "slot", "memory", "CPUs", "cells", "predicted",
                                   "cells in build order"], rows, align="lrrrrrl"),
           f"Predicted makespan **{format_duration(doc['makespan_seconds'])}** (lower bounds: "
           f"whole groups {format_duration(doc['group_bound_seconds'])}, fluid "
           f"{format_duration(doc['lower_bound_seconds'])}).\n"]
    if doc.get("unplaced"):
        out.append("\nNo builder has the platform or the memory for: "
                   + ", ".join(f"`{c}`" for c in doc["unplaced"]) + "\n")
    return "\n".join(out)


def _work(args: argparse.Namespace) -> int:

    memory = parse_size(args.memory, what="--memory")
    work = plan_work(selected_cells(args), memory=memory, cpus=args.cpus,
                     history=load_history(matrix_from_args(args)))  # as the builds will plan
    if args.emit is None:
        if args.json:
            print_json(work.as_dict())
        else:
            for line in work.lines():
                print(line)
        return 0
    work = local_runner_work(work)
    command = _job_command(args)
    if args.emit == "slurm":
        return _slurm(args, work, command)
    return _kubernetes(args, work, command)


def _job_command(args: argparse.Namespace) -> JobCommand:
    if args.job_matrix:
        matrix = args.job_matrix
    elif args.emit == "slurm":
        matrix = str((args.matrix or Path("matrix.toml")).resolve())
    else:
        matrix = "matrix.toml"
    matrix_from_args(args)  # a matrix that does not load fails here, not in every job
    return JobCommand(factory=factory_command(args.factory), matrix=matrix,
                      store=store_from_args(args), cache=not args.no_cache,
                      lease_ttl=args.lease_ttl, extra=tuple(args.build_arg))


def _slurm(args: argparse.Namespace, work: Work, command: JobCommand) -> int:
    opts = slurm.SlurmOptions(
        log_dir=(args.log_dir or args.out / "logs").resolve(),
        workdir=(args.chdir or Path.cwd()).resolve(), partition=args.partition,
        account=args.account, extra=tuple(args.sbatch_option))
    scripts = slurm.write_scripts(work, args.out, command, opts)
    _print_written(work, scripts, args.out / "submit.sh")
    if args.submit:
        for s in slurm.submit(work, scripts):
            print(f"submitted {s.job_name} as job {s.job_id}" if s.job_id else
                  f"queued already: {s.job_name} (not submitted again)")
    return 0


def _kubernetes(args: argparse.Namespace, work: Work, command: JobCommand) -> int:
    opts = kubernetes.KubernetesOptions(image=args.image, workdir=args.workdir,
                                        secret=args.secret, namespace=args.namespace)
    paths = kubernetes.write_manifests(work, args.out, command, opts)
    _print_written(work, paths, None)
    if args.apply:
        print(kubernetes.apply(paths).rstrip())
    return 0


def _print_written(work: Work, paths: list[Path], extra: Path | None) -> None:
    for g, p in zip(work.groups, paths, strict=True):
        print(f"wrote {p}: {g.line()}")
    if extra is not None:
        print(f"wrote {extra}")
    for r in work.refused:
        print(f"refused {r.name}: {r.reason}")


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": 1, **doc}, indent=2) + "\n")
    tmp.replace(path)
