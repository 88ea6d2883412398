"""factory request SPEC --torch V --cuda V --arch A --python V [--store] [--matrix] [--index-url URL]

Prints progress on stderr and the install line alone on stdout, so a script can run
``$(factory request ...)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from factory.ci import runner_label
from factory.commands._common import (
    add_matrix_arg,
    add_store_arg,
    matrix_from_args,
    print_json,
    store_from_args,
)
from factory.hosts.request import request, request_cell
from factory.planning.budget import requested_budget
from factory.runners import RUNNERS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="the package and its version: flash-attn==2.8.3.post2")
    parser.add_argument("--torch", required=True, help="torch version, e.g. 2.10.0")
    parser.add_argument("--cuda", required=True, help="CUDA version of that torch build, e.g. 12.8")
    parser.add_argument("--arch", action="append", required=True,
                        help="GPU compute capability, e.g. 10.0 (repeat or comma-separate for several)")
    parser.add_argument("--python", required=True, help="Python version, e.g. 3.12")
    add_store_arg(parser)
    add_matrix_arg(parser)
    parser.add_argument("--index-url", default=None,
                        help="the index root hosts install from (default: $FACTORY_INDEX_URL, "
                             "or the local store as a file:// URL)")
    parser.add_argument("--runner", choices=tuple(RUNNERS), default=None)
    parser.add_argument("--memory", default=None, help="memory cap for a build, e.g. 16g")
    parser.add_argument("--out", type=Path, default=None, help="where a built wheel goes (default: dist/)")
    parser.add_argument("--print-cell", action="store_true",
                        help="only print the cell id (and its runner label) and exit: no store, no build")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    cell = request_cell(args.spec, torch=args.torch, cuda=args.cuda, archs=args.arch, python=args.python)
    matrix = matrix_from_args(args)
    if args.print_cell:
        pc = matrix.find(cell.id)  # validates the cell against the recipe and the torch/CUDA table
        if args.json:
            print_json({"cell": pc.cell.id, "variant": pc.variant, "wheel": pc.wheel,
                        "content_key": pc.content_key, "runner": runner_label(pc.cell.package)})
        else:
            print(pc.cell.id)
        return 0
    store = store_from_args(args)
    print(f"request {cell.id} (store {store})", file=sys.stderr)
    result = request(
        cell, matrix=matrix, store_spec=store, index_url=args.index_url,
        runner=args.runner or matrix.settings.runner,
        budget=requested_budget(matrix.settings, memory=args.memory),
        out_dir=args.out,
    )
    status = "built and published" if result.built else "already published, nothing to build"
    print(f"{result.wheel}: {status}", file=sys.stderr)
    if args.json:
        print_json(result.as_dict())
    else:
        print(result.install)
    return 0
