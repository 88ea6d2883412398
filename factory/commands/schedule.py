"""factory schedule --builders FILE [--matrix PATH] [--missing --store STORE] [--json]"""

from __future__ import annotations

import argparse
from pathlib import Path

from factory.commands._common import add_matrix_arg, print_json
from factory.commands.matrix import add_selection_args, selected_cells


def configure(parser: argparse.ArgumentParser) -> None:
    add_matrix_arg(parser)
    add_selection_args(parser)
    parser.add_argument("--builders", type=Path, required=True, metavar="FILE",
                        help="TOML: [[builder]] name, memory, cpus, platform, labels")


def run(args: argparse.Namespace) -> int:
    from factory.planning.builders import load_builders
    from factory.planning.memory_model import MemoryHistory
    from factory.planning.schedule import schedule

    builders = load_builders(args.builders)
    cells = selected_cells(args)
    found = schedule(cells, builders, history=MemoryHistory.load())
    if args.json:
        print_json(found.as_dict())
        return 0
    for line in found.lines():
        print(line)
    return 0
