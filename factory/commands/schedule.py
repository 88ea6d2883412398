"""factory schedule --builders FILE [--matrix PATH] [--missing --store STORE]
[--json | --markdown] [--html FILE]"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from factory import actions
from factory.commands._common import add_matrix_arg, print_json
from factory.commands.matrix import add_selection_args, selected_cells
from factory.planning.memory_model import MemoryHistory
from factory.planning.schedule import load_builders, schedule
from factory.reports.lanes import lanes_html
from factory.reports.page import write_page
from factory.units import format_duration, format_size


def configure(parser: argparse.ArgumentParser) -> None:
    add_matrix_arg(parser)
    add_selection_args(parser)
    parser.add_argument("--builders", type=Path, required=True, metavar="FILE",
                        help="TOML: [[builder]] name, memory, cpus, platform, labels")
    parser.add_argument("--markdown", action="store_true",
                        help="the schedule as Markdown tables (a CI job's step summary)")
    parser.add_argument("--html", metavar="FILE", type=Path, default=None,
                        help="also write the lanes (builders, slots, cells over time) as a page")


def run(args: argparse.Namespace) -> int:
    builders = load_builders(args.builders)
    cells = selected_cells(args)
    found = schedule(cells, builders, history=MemoryHistory.load())
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
