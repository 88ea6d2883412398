"""factory build CELL... | --all | --missing [--dry-run] [--runner R] [--memory SIZE] [--out DIR]"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from factory import actions
from factory.build.job import BuildOptions
from factory.build.pipeline import BuildRun, build_cell, build_cells, start_run
from factory.build.readiness import ReadinessChecker
from factory.commands._common import (
    add_matrix_arg,
    add_runner_arg,
    add_store_arg,
    matrix_from_args,
    store_from_args,
)
from factory.commands.matrix import selected_cells
from factory.errors import CellError, FactoryError, ToolchainError, UsageError
from factory.logger import Log, naming_cell
from factory.matrix.cell import Cell
from factory.matrix.load import Matrix
from factory.planning.budget import requested_budget
from factory.runners import kinds_taking, runner_kind
from factory.units import format_duration, format_size


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cells", nargs="*", metavar="CELL", help="cell ids (see 'factory matrix')")
    parser.add_argument("--all", action="store_true", help="every cell of the matrix")
    parser.add_argument("--missing", action="store_true",
                        help="every cell of the matrix that --store lacks (implies --all)")
    parser.add_argument("--package", action="append", help="with --all: only these packages")
    add_matrix_arg(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan, container settings and environment")
    add_runner_arg(parser)
    parser.add_argument("--memory", default=None,
                        help="memory cap for the build, e.g. 16g (default: detected)")
    parser.add_argument("--cpus", type=int, default=None,
                        help="CPUs for the build (default: detected)")
    parser.add_argument("--out", type=Path, default=Path("dist"),
                        help="where final wheels go (default: dist/)")
    parser.add_argument("--publish", action="store_true",
                        help="publish each verified wheel to --store")
    add_store_arg(parser)
    parser.add_argument("--force", action="store_true",
                        help="build even if the store has this content key")
    parser.add_argument("--no-import-check", action="store_true",
                        help="skip the clean-venv import check")
    parser.add_argument("--cache", action="store_true",
                        help="use the shared compile cache (sccache)")
    parser.add_argument("--json", action="store_true",
                        help="print outcomes (and dry-run details) as JSON")
    parser.add_argument(
        "--python-env", choices=("venv", "system-site", "existing"), default=None,
        help=f"{kinds_taking('mode')} runner: a fresh venv from the wheelhouse (default), a venv "
        "that sees the interpreter's packages (a preinstalled torch), or the interpreter as it is",
    )
    parser.add_argument("--interpreter", default=None, metavar="EXE",
                        help=f"{kinds_taking('interpreter')} runner: the Python to build with "
                        "(default: python3.X on PATH)")
    parser.add_argument("--max-jobs", type=int, default=None, metavar="N",
                        help="fix MAX_JOBS instead of planning it (to reproduce a hand-picked "
                        "value)")
    parser.add_argument("--nvcc-threads", type=int, default=None, metavar="N",
                        help="fix NVCC_THREADS")
    parser.add_argument("--attempts", type=int, default=None, metavar="N",
                        help="at most N attempts (OOM retries with fewer jobs); default 4")
    parser.add_argument(
        "--unbuildable", choices=("skip", "fail"), default=None,
        help="a cell whose toolchain is missing here (e.g. the CUDA 12.x image): skip it with one "
        "line, or fail before any download (default: skip with --all, fail for named cells)",
    )
    parser.add_argument("--lease-ttl", type=float, default=None, metavar="SECONDS",
                        help="with --publish: how long a cell's lease in the store outlives a "
                        "builder that stopped renewing it (default 900)")
    parser.add_argument("--uncapped", action="store_true",
                        help=f"{kinds_taking('uncapped')} runner: run without a cgroup memory cap "
                        "(where cgroups are not writable)")


def run(args: argparse.Namespace) -> int:
    if args.lease_ttl is not None and not args.lease_ttl > 0:
        raise UsageError(f"--lease-ttl must be positive, not {args.lease_ttl:g}")
    for flag in ("max_jobs", "nvcc_threads", "attempts"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1, not {value}")
    matrix = matrix_from_args(args)
    args.all = args.all or args.missing
    if args.all == bool(args.cells):
        raise UsageError("give cell ids or --all (not both)",
                         tip="'factory matrix' lists the cell ids")
    if args.missing:
        cells = selected_cells(args, matrix)
        Log().step(f"{len(cells)} cell(s) of the matrix are not in {store_from_args(args)}")
    elif args.all:
        cells = matrix.cells_of(args.package)
    else:
        cells = [matrix.find(c) for c in args.cells]
    budget = requested_budget(matrix.settings, memory=args.memory, cpus=args.cpus)
    store = store_from_args(args) if (args.publish or args.store) else None
    opts = BuildOptions(
        runner=args.runner or matrix.settings.runner,
        budget=budget, out_dir=args.out, store=store, publish=args.publish,
        dry_run=args.dry_run, force=args.force, verify_import=not args.no_import_check,
        cache=args.cache, verbose=args.verbose, runner_options=_runner_options(args),
        max_jobs=args.max_jobs, nvcc_threads=args.nvcc_threads, lease_ttl=args.lease_ttl,
        **({"attempts": args.attempts} if args.attempts else {}),
    )
    log = Log()

    checker = ReadinessChecker(matrix.settings, runner=opts.runner)
    ready = {pc.cell.id: checker.check(pc) for pc in cells}
    if args.dry_run:
        outcomes = build_cells(cells, matrix=matrix, opts=opts, log=log)
        details = [{**json.loads(o.detail), "toolchain_ready": ready[o.cell_id].as_dict()}
                   for o in outcomes]
        if args.json:
            json.dump({"version": 1, "dry_run": details}, sys.stdout, indent=2)
            print()
        else:
            for d in details:
                _print_dry_run(d)
        return 0
    cells = _buildable(cells, ready,
                       skip=(args.unbuildable or ("skip" if args.all else "fail")) == "skip",
                       log=log)
    failures: list[tuple[str, FactoryError]] = []
    outcomes = []
    run = _started(matrix, opts) if cells else None
    for pc in cells:
        try:
            if isinstance(run, FactoryError):
                raise run
            outcomes.append(build_cell(matrix, pc, opts, log, run))
        except FactoryError as exc:
            if len(cells) == 1:
                if actions.on_actions():  # the job's summary says so too
                    actions.append_summary(summary_markdown(
                        [], [(pc.cell.id, exc)], published=args.publish))
                raise
            failures.append((pc.cell.id, exc))
            with naming_cell(matrix.short_id(pc.cell)):
                log.error(f"FAILED {pc.cell.id}: {exc.message}", title=pc.cell.id)
    summarize(log, outcomes, failures, published_to=store if args.publish else None,
              short_ids={pc.cell.id: matrix.short_id(pc.cell) for pc in cells})
    if actions.on_actions():
        actions.append_summary(summary_markdown(outcomes, failures, published=args.publish))
    if args.json:
        json.dump({"version": 1, "outcomes": outcomes_json(outcomes)}, sys.stdout, indent=2)
        print()
    if failures:
        return failures[0][1].exit_code
    return 0


def summarize(log: Log, outcomes: list[Any], failures: list[tuple[str, FactoryError]], *,
              published_to: str | None, short_ids: Mapping[str, str] | None = None) -> None:
    """One line per cell at the end (what the CI log, a Slurm job's --output, a queue
    worker's log shows last), each naming its cell (``short_ids``: the matrix's, else the id's
    own short id); the heading too where there is one cell."""
    def named(cell_id: str) -> contextlib.AbstractContextManager[None]:
        short = (short_ids or {}).get(cell_id) or _short_id(cell_id)
        return naming_cell(short) if short else contextlib.nullcontext()

    ids = list(dict.fromkeys([o.cell_id for o in outcomes] + [c for c, _ in failures]))
    with named(ids[0]) if len(ids) == 1 else contextlib.nullcontext():
        log.step("summary")
    for o in outcomes:
        n = len(o.attempts)
        extra = f", {n} attempt(s)" if n else ""
        if n and o.attempts[-1].get("cache_hits") is not None:
            last = o.attempts[-1]
            extra += f", compile cache {last['cache_hits']} hits/{last['cache_misses']} misses"
        where = o.wheel.resolve() if o.wheel else o.detail
        if o.wheel and published_to and o.status in ("built", "unchanged"):
            where = f"{where}, published to {published_to}"
        with named(o.cell_id):
            log.detail(f"{o.status:9} {o.cell_id} ({o.seconds:.0f}s{extra}) -> {where}")
    for cell_id, error in failures:
        with named(cell_id):
            log.detail(f"{'failed':9} {cell_id}: {error.message}")


def _short_id(cell_id: str) -> str | None:
    """A cell id's short id; None for what is no cell id (a work-queue group's name)."""
    try:
        return Cell.from_id(cell_id).short_id
    except CellError:
        return None


def outcomes_json(outcomes: list[Any]) -> list[dict[str, Any]]:
    return [{"cell": o.cell_id, "status": o.status, "wheel": str(o.wheel) if o.wheel else None,
             "attempts": list(o.attempts), "seconds": round(o.seconds, 1)} for o in outcomes]


def summary_markdown(outcomes: list[Any], failures: list[tuple[str, FactoryError]], *,
                     published: bool) -> str:
    """The job's step summary for these builds: one table row per cell."""
    rows: list[list[object]] = []
    for o in outcomes:
        attempts = len(o.attempts)
        hits = o.attempts[-1].get("cache_hits") if attempts else None
        cache = f"{hits}/{o.attempts[-1].get('cache_misses')}" if hits is not None else ""
        status = "published" if published and o.status == "built" else o.status
        rows.append([f"`{o.cell_id}`", status, format_duration(o.seconds), attempts or "",
                     cache, f"`{o.wheel.name}`" if o.wheel else o.detail])
    rows += [[f"`{cell}`", "**failed**", "", "", "", exc.message] for cell, exc in failures]
    head = f"### factory build: {len(outcomes)} done, {len(failures)} failed\n\n"
    return head + actions.markdown_table(
        ["cell", "status", "time", "attempts", "cache hits/misses", "wheel"], rows,
        align="llrrrl")


def _buildable(cells: list[Any], ready: dict[str, Any], *, skip: bool, log: Log) -> list[Any]:
    """The cells whose toolchain exists here or is made on the way; the others are skipped with
    one line each, or (``skip`` False) the first stops the run before anything is downloaded."""
    out = []
    for pc in cells:
        r = ready[pc.cell.id]
        if r.buildable:
            out.append(pc)
            continue
        if not skip:
            raise ToolchainError(f"{pc.cell.id}: no toolchain here ({r.detail})",
                                 tip=f"make it: {r.command}" if r.command else None)
        log.step(f"skipped {pc.cell.id}: no toolchain here ({r.detail})"
                 + (f"; make it: {r.command}" if r.command else ""))
    return out


def _started(matrix: Matrix, opts: BuildOptions) -> BuildRun | FactoryError:
    """The runner and the stores, once for the batch; an error here fails every cell, as it
    would have failed each one's build."""
    try:
        return start_run(matrix, opts)
    except FactoryError as exc:
        return exc


def _runner_options(args: argparse.Namespace) -> dict[str, object]:
    opts: dict[str, object] = {}
    if args.python_env:
        opts["mode"] = args.python_env
    if args.uncapped:
        opts["uncapped"] = True
    if args.interpreter:
        opts["interpreter"] = args.interpreter
    if opts and args.runner and not set(opts) <= set(runner_kind(args.runner).options):
        raise UsageError("--python-env, --uncapped and --interpreter apply to the "
                         f"{kinds_taking(*opts)} runner only")
    return opts


def _print_dry_run(d: dict[str, object]) -> None:
    plan = d["plan"]
    assert isinstance(plan, dict)
    print(f"cell         {d['cell']}")
    print(f"wheel        {d['wheel']}")
    print(f"plan         MAX_JOBS={plan['max_jobs']} NVCC_THREADS={plan['nvcc_threads']} "
          f"(predicted peak {format_size(plan['predicted_peak_bytes'])} of "
          f"{format_size(plan['memory_budget_bytes'])})")
    ready = d["toolchain_ready"]
    assert isinstance(ready, dict)
    print(f"toolchain    {ready['state']}: {ready['detail']}"
          + (f"; make it: {ready['command']}" if ready.get("command") else ""))
    requirements = d["requirements"]
    assert isinstance(requirements, list)
    print(f"requirements {' '.join(requirements)}  (installed offline from the wheelhouse)")
    runner = d["runner"]
    assert isinstance(runner, dict)
    print(f"runner       {runner.get('runner')}")
    for key, value in runner.items():
        if key in ("runner", "inside_job"):
            continue
        if not isinstance(value, dict):
            print(f"  {key} = {_value(key, value)}")
            continue
        print(key)
        for k, v in value.items():
            if k == "volumes" and isinstance(v, dict):
                print("  volumes")
                for host, bind in v.items():
                    print(f"    {bind.get('bind')} <- {host} ({bind.get('mode')})")
            else:
                print(f"  {k} = {_value(k, v)}")
    print("environment")
    env = d["env"]
    assert isinstance(env, dict)
    for k, v in sorted(env.items()):
        print(f"  {k}={v}")
    compilers = d.get("compilers")
    if isinstance(compilers, dict) and compilers.get("applies"):
        print("compilers    (the factory's nvcc and C++ wrappers, every compile)")
        for line in compilers["applies"]:
            print(f"  {line}")


def _value(key: str, value: object) -> str:
    """A setting as the runner takes it; a memory size also in binary units."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20 and (
            "mem" in key or key.endswith("_bytes")):
        return f"{value} ({format_size(value)})"
    return str(value)
