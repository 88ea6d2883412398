"""A schedule's lanes: one row per builder slot, its cells one after the other as the schedule
predicts them (``factory schedule --json``: cells in build order, each one's predicted end),
the makespan and the two lower bounds as lines across."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factory.errors import CellError
from factory.matrix.cell import Cell
from factory.reports.page import COLORS, Frame, esc, legend, page
from factory.units import format_duration, format_size

LANE = 26  # pixels per slot
PALETTE = ("#0072b2", "#009e73", "#cc79a7", "#56b4e9", "#e69f00", "#d55e00", "#f0e442")


def _names(cell_id: str) -> tuple[str, str]:
    """(package, short id) of a cell id; the id itself when it does not parse."""
    try:
        cell = Cell.from_id(cell_id)
    except CellError:
        return cell_id, cell_id
    return cell.package, cell.short_id


def lanes_svg(doc: Mapping[str, Any]) -> str:
    rows = [(b["name"], slot) for b in doc["builders"] for slot in b["slots"] if slot["cells"]]
    span = max([doc.get("makespan_seconds") or 0.0, 1.0])
    frame = Frame(width=1100, height=max(90, len(rows) * LANE + 50), x_max=span * 1.03,
                  y_max=max(1, len(rows)), left=200)
    packages: dict[str, str] = {}
    for r, (builder, slot) in enumerate(rows):
        y = frame.row_y(r)
        frame.add(f'<text x="{frame.left - 8}" y="{y + LANE / 2 + 4:.1f}" text-anchor="end">'
                  f'{esc(builder)} slot {slot["slot"]} ({esc(format_size(slot["memory_bytes"]))}'
                  f', {slot["cpus"]} CPUs)</text>')
        ends = slot.get("cell_ends_seconds") or [slot["predicted_seconds"]] * len(slot["cells"])
        start = 0.0
        for cell_id, end in zip(slot["cells"], ends, strict=False):
            package, label = _names(cell_id)
            color = packages.setdefault(package, PALETTE[len(packages) % len(PALETTE)])
            x0, x1 = frame.x(start), frame.x(end)
            tip = f"{cell_id}: {format_duration(start)} to {format_duration(end)}"
            frame.add(f'<g class="cell"><rect x="{x0:.1f}" y="{y + 3:.1f}" '
                      f'width="{max(1.0, x1 - x0 - 1):.1f}" height="{LANE - 6}" fill="{color}" '
                      f'rx="3"><title>{esc(tip)}</title></rect>')
            if x1 - x0 > 7 * len(label) * 0.6:
                frame.add(f'<text x="{x0 + 4:.1f}" y="{y + LANE / 2 + 4:.1f}" fill="#fff" '
                          f'style="fill:#fff">{esc(label)}</text>')
            frame.add("</g>")
            start = end
    for key, name, dash in (("makespan_seconds", "makespan", ""),
                            ("group_bound_seconds", "whole-group bound", "6 4"),
                            ("lower_bound_seconds", "fluid bound", "2 3")):
        value = doc.get(key)
        if value:
            x = frame.x(value)
            frame.add(f'<line class="{key}" x1="{x:.1f}" y1="{frame.top}" x2="{x:.1f}" '
                      f'y2="{frame.top + frame.inner_h:.1f}" stroke="{COLORS["cap"]}" '
                      f'stroke-dasharray="{dash}"><title>{esc(name)} '
                      f'{esc(format_duration(value))}</title></line>')
    frame.time_axis("predicted time")
    legend_items = [(p, c) for p, c in packages.items()]
    return legend(legend_items) + frame.svg(f"{len(rows)} slot(s) over time")


def lanes_html(doc: Mapping[str, Any]) -> str:
    cells = sum(len(s["cells"]) for b in doc["builders"] for s in b["slots"])
    body = ["<h1>Schedule: builders and their slots</h1>",
            f'<p class="sub">{cells} cell(s); predicted makespan '
            f'<b>{esc(format_duration(doc.get("makespan_seconds") or 0))}</b> (lower bounds: '
            f'whole groups {esc(format_duration(doc.get("group_bound_seconds") or 0))}, fluid '
            f'{esc(format_duration(doc.get("lower_bound_seconds") or 0))})</p>',
            f'<div class="scroll lanes">{lanes_svg(doc)}</div>']
    if doc.get("unplaced"):
        body.append("<p>No builder has the platform or the memory for: "
                    + ", ".join(f"<code>{esc(c)}</code>" for c in doc["unplaced"]) + "</p>")
    return page("schedule", body)
