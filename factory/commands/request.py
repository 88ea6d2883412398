"""factory request SPEC --torch V --cuda V --arch A --python V [--platform CPU] [--store]
                  [--matrix] [--index-url URL [--cert FILE]] [--print-cell [--builders FILE]]
                  [--check | --yes]

Prints progress on stderr and the install line alone on stdout, so a script can run
``$(factory request ...)``. A cell that is not published yet is built only after a yes: asked
on a terminal, ``--yes`` elsewhere; ``--check`` only says whether it is published (exit 0 with
its install line, 1 without).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from factory.ci import DEFAULT_BUILDERS, runs_on
from factory.commands._common import (
    add_cert_arg,
    add_matrix_arg,
    add_runner_arg,
    add_store_arg,
    matrix_from_args,
    print_json,
    store_from_args,
)
from factory.errors import PlanError, UsageError
from factory.hosts.request import NOT_PUBLISHED_EXIT, look_up, request, request_cell
from factory.matrix.cell import DEFAULT_PLATFORM, PLATFORMS
from factory.matrix.expand import one_off
from factory.matrix.load import Matrix, PlannedCell
from factory.matrix.settings import Settings
from factory.planning.budget import requested_budget
from factory.planning.builders import load_builders
from factory.planning.planner import plan_build
from factory.units import format_duration


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC",
                        help="the package and its version: flash-attn==2.8.3.post2 (or "
                        "flash-attn: its newest release)")
    parser.add_argument("--torch", required=True,
                        help="torch version, e.g. 2.10.0, or 'latest' (the newest release)")
    parser.add_argument("--cuda", required=True,
                        help="CUDA version of that torch build, e.g. 12.8, or 'default' "
                        "(PyPI's build of that torch)")
    parser.add_argument("--arch", action="append", required=True,
                        help="GPU compute capability, e.g. 10.0, or a GPU's name, e.g. B200 "
                        "(repeat or comma-separate for several)")
    parser.add_argument("--python", required=True, help="Python version, e.g. 3.12")
    parser.add_argument("--platform", default=DEFAULT_PLATFORM, choices=PLATFORMS,
                        help=f"the CPU of the hosts (default {DEFAULT_PLATFORM}; aarch64: Grace "
                             "hosts such as GB200)")
    add_store_arg(parser)
    add_matrix_arg(parser)
    parser.add_argument("--index-url", default=None,
                        help="the index root hosts install from (default: $FACTORY_INDEX_URL, "
                             "or the local store as a file:// URL)")
    add_cert_arg(parser, verifies=False)
    add_runner_arg(parser)
    parser.add_argument("--memory", default=None, help="memory cap for a build, e.g. 16g")
    parser.add_argument("--out", type=Path, default=None,
                        help="where a built wheel goes (default: dist/)")
    parser.add_argument("--print-cell", action="store_true",
                        help="only print the cell id (and, with --json, the runs-on labels of a "
                             "builder for it) and exit: no store, no build")
    parser.add_argument("--builders", type=Path, default=None, metavar="FILE",
                        help=f"the builders a --print-cell --json runner label comes from "
                             f"(default: {DEFAULT_BUILDERS})")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true",
                      help="only say whether the wheel is published (exit 1 when not): never "
                      "builds")
    what.add_argument("-y", "--yes", action="store_true",
                      help="build a cell that is not published without asking (a script, CI)")


def _confirm(args: argparse.Namespace, store: str,
             settings: Settings) -> Callable[[PlannedCell], bool] | None:
    """Ask before a build: on a terminal, yes or no; elsewhere refuse without --yes."""
    if args.yes:
        return None

    def ask(pc: PlannedCell) -> bool:
        try:
            plan = plan_build(pc, budget=requested_budget(settings, memory=args.memory))
            took = (f" (the plan: about {format_duration(plan.predicted_seconds)} of compiling "
                    f"with {plan.max_jobs} job(s))" if plan.predicted_seconds else "")
        except PlanError as exc:
            raise PlanError(f"{pc.cell.id} is not published in {store}, and it cannot be "
                            f"built here: {exc.message}", tip=exc.tip) from None
        if not sys.stdin.isatty():
            raise UsageError(f"{pc.cell.id} is not published in {store}: building it takes a "
                             f"while{took}",
                             tip="pass --yes to build it without asking, or --check to only look")
        print(f"{pc.cell.id} is not published in {store}. Build and publish it now{took}? "
              "[y/N] ", end="", file=sys.stderr, flush=True)
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    return ask


def run(args: argparse.Namespace) -> int:
    matrix = matrix_from_args(args)
    spec, torch, cuda = _resolved(matrix, args)
    cell = request_cell(spec, torch=torch, cuda=cuda, archs=args.arch, python=args.python,
                        platform=args.platform)
    if args.print_cell:
        pc = matrix.find(cell.id, outside=True)  # validates it against the recipe and the facts
        if args.json:
            where = runs_on(pc.cell.package, pc.cell.platform,
                            load_builders(args.builders or DEFAULT_BUILDERS))
            print_json({"cell": pc.cell.id, "variant": pc.variant, "wheel": pc.wheel,
                        "content_key": pc.content_key, "runner": where.label, "cpu": where.cpu,
                        "builder": where.builder,
                        # the request with its rules resolved: what the build job is given
                        "spec": f"{pc.cell.package}=={pc.cell.version}", "torch": pc.cell.torch,
                        "cuda": pc.cell.cuda})
        else:
            print(pc.cell.id)
        return 0
    store = store_from_args(args)
    print(f"request {cell.id} (store {store})", file=sys.stderr)
    if args.check:
        pc, result = look_up(cell, matrix=matrix, store_spec=store, index_url=args.index_url,
                             cert=args.cert)
        if result is None:
            print(f"{pc.cell.id}: not published in {store}", file=sys.stderr)
            if args.json:
                print_json({"cell": pc.cell.id, "published": False, "wheel": pc.wheel})
            return NOT_PUBLISHED_EXIT
    else:
        result = request(
            cell, matrix=matrix, store_spec=store, index_url=args.index_url,
            runner=args.runner or matrix.settings.runner,
            budget=requested_budget(matrix.settings, memory=args.memory),
            out_dir=args.out, confirm=_confirm(args, store, matrix.settings), cert=args.cert,
        )
        if result is None:
            print(f"{cell.id}: not built (declined)", file=sys.stderr)
            return NOT_PUBLISHED_EXIT
    status = "built and published" if result.built else "already published, nothing to build"
    print(f"{result.wheel}: {status}", file=sys.stderr)
    if args.json:
        print_json(result.as_dict())
    else:
        print(result.install)
    return 0


def _resolved(matrix: Matrix, args: argparse.Namespace) -> tuple[str, str, str]:
    """SPEC, --torch and --cuda with their rules resolved as the matrix resolves its own
    ('latest', 'default', a bare package name), said on stderr when one was a rule."""
    spec = args.spec
    try:
        req = Requirement(spec)
    except InvalidRequirement:
        raise UsageError(f"cannot read the request {spec!r}",
                         tip="write it like flash-attn==2.8.3.post2") from None
    specs = list(req.specifier)
    pinned = (specs[0].version if len(specs) == 1 and specs[0].operator in ("==", "===")
              and "*" not in specs[0].version else None)
    if req.extras or req.marker or req.url or (specs and pinned is None):
        return spec, args.torch, args.cuda  # request_cell refuses it in one line
    version, torch, cuda = one_off(matrix.facts, matrix.package(req.name), version=pinned,
                                   torch=args.torch, cuda=args.cuda)
    if (version, torch, cuda) != (pinned, args.torch, args.cuda):
        print(f"resolved {spec} --torch {args.torch} --cuda {args.cuda} -> "
              f"{req.name}=={version} --torch {torch} --cuda {cuda} "
              f"({matrix.facts.describe()})", file=sys.stderr)
    return f"{req.name}=={version}", torch, cuda
