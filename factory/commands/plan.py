"""factory plan CELL [--matrix PATH] [--memory SIZE] [--cpus N] [--history PATH] [--json]"""

from __future__ import annotations

import argparse

from factory.units import format_size, parse_size
from factory.errors import UsageError
from factory.build.pipeline import load_history
from factory.planning.memory_model import HISTORY_ENV
from factory.planning.planner import plan_build
from factory.commands._common import add_matrix_arg, matrix_from_args, print_json


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cell", metavar="CELL", help="a cell id ('factory matrix' lists them)")
    add_matrix_arg(parser)
    parser.add_argument("--memory", default=None, metavar="SIZE",
                        help="memory budget like 16g or 512M (default: this cgroup's limit)")
    parser.add_argument("--cpus", type=int, default=None, metavar="N",
                        help="CPU budget (default: this cgroup's quota and CPU affinity)")
    parser.add_argument("--history", default=None, metavar="PATH",
                        help=f"memory history file (default: ${HISTORY_ENV}, else the matrix's "
                        "memory-history setting, layered over the shipped defaults)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    if args.cpus is not None and args.cpus < 1:
        raise UsageError(f"--cpus must be at least 1, not {args.cpus}")
    matrix = matrix_from_args(args)
    pc = matrix.find(args.cell)
    memory = parse_size(args.memory) if args.memory is not None else None
    plan = plan_build(pc, memory=memory, cpus=args.cpus, history=load_history(matrix, args.history),
                      memory_label="--memory", cpus_label="--cpus")
    if args.json:
        print_json(plan.as_dict())
        return 0
    print(plan.cell_id)
    print(f"    MAX_JOBS={plan.max_jobs} NVCC_THREADS={plan.nvcc_threads}")
    print(f"    predicted peak {format_size(plan.predicted_peak_bytes)} of "
          f"{format_size(plan.memory_budget_bytes)}")
    for reason in plan.reasons:
        print(f"    - {reason}")
    return 0
