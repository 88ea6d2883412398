"""factory plan CELL [--matrix PATH] [--memory SIZE] [--cpus N] [--history PATH] [--json]"""

from __future__ import annotations

import argparse

from factory.build.pipeline import load_history
from factory.commands._common import add_matrix_arg, matrix_from_args, print_json
from factory.environment import HISTORY_ENV
from factory.planning.budget import requested_budget
from factory.planning.planner import plan_build
from factory.units import format_size


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cell", metavar="CELL", help="a cell id ('factory matrix' lists them)")
    add_matrix_arg(parser)
    parser.add_argument("--memory", default=None, metavar="SIZE",
                        help="memory budget like 16g or 512M (default: the matrix's memory "
                        "setting, else this cgroup's limit)")
    parser.add_argument("--cpus", type=int, default=None, metavar="N",
                        help="CPU budget (default: the matrix's cpus setting, else this cgroup's "
                        "quota and CPU affinity)")
    parser.add_argument("--history", default=None, metavar="FILE",
                        help=f"memory history file (default: ${HISTORY_ENV}, else the matrix's "
                        "memory-history setting, layered over the shipped defaults)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    matrix = matrix_from_args(args)
    budget = requested_budget(matrix.settings, memory=args.memory, cpus=args.cpus)
    pc = matrix.find(args.cell)
    plan = plan_build(pc, budget=budget, history=load_history(matrix, args.history))
    if args.json:
        print_json(plan.as_dict())
        return 0
    print(plan.cell_id)
    print(f"    MAX_JOBS={plan.max_jobs} NVCC_THREADS={plan.nvcc_threads}")
    peak = f"    predicted peak {format_size(plan.predicted_peak_bytes)}"
    if plan.predicted_peak_range:
        lo, hi = plan.predicted_peak_range
        if lo != hi:
            peak += f" (range {format_size(lo)} to {format_size(hi)})"
    print(f"{peak} of {format_size(plan.memory_budget_bytes)}")
    if plan.predicted_seconds is not None:
        line = f"    predicted compile {plan.predicted_seconds / 60:.0f} min"
        if plan.predicted_seconds_range:
            lo_s, hi_s = plan.predicted_seconds_range
            line += f" (range {lo_s / 60:.0f} to {hi_s / 60:.0f} min)"
        print(line + f" from {len(plan.range_runs)} recorded run(s) of its objects")
        print(f"    predicted cell {(plan.predicted_cell_seconds or 0) / 60:.0f} min: the "
              f"compile + {plan.cell_overhead_seconds:.0f} s around it")
    for reason in plan.reasons:
        print(f"    - {reason}")
    return 0
