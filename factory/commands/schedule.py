"""factory schedule --builders FILE [--matrix PATH] [--missing --store STORE] [--json]"""

from __future__ import annotations

import argparse
from pathlib import Path

from factory.build.pipeline import load_history
from factory.commands._common import add_matrix_arg, matrix_from_args, print_json
from factory.commands.matrix import add_selection_args, selected_cells
from factory.planning.schedule import load_builders, schedule


def configure(parser: argparse.ArgumentParser) -> None:
    add_matrix_arg(parser)
    add_selection_args(parser)
    parser.add_argument("--builders", type=Path, required=True, metavar="FILE",
                        help="TOML: [[builder]] name, memory, cpus, platform, labels")


def run(args: argparse.Namespace) -> int:
    builders = load_builders(args.builders)
    cells = selected_cells(args)
    # the history `factory plan` and `factory build` read: one cell model for all three
    found = schedule(cells, builders, history=load_history(matrix_from_args(args)))
    if args.json:
        print_json(found.as_dict())
        return 0
    for line in found.lines():
        print(line)
    return 0
