"""What the GitHub Actions workflows need that the CLI does not print: the self-hosted runner
label (by memory size) each cell should build on, and one builder's slots of a schedule.

``python -m factory.ci builder-slots NAME < schedule.json`` reads ``factory schedule --json``
output and prints one line per slot of builder NAME: ``MEMORY CPUS CELL...``, the cells in
build order (a later one takes the earlier one's kernels from the compile cache).

``python -m factory.ci runner-labels < matrix.json`` reads ``factory matrix --json`` output and
adds ``"runner": "<label>"`` to each entry of ``"include"``, so a workflow can write
``runs-on: [self-hosted, linux, x64, "${{ matrix.runner }}"]``. Any cell builds in any memory
(the planner lowers MAX_JOBS to fit); the label only decides how fast, so a plain table per
package is enough.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from packaging.utils import canonicalize_name

# flash-attn: about 4.5 GB per concurrently compiling arch (measured: docs/BENCHMARKS.md); 256 GB
# lets a 32-core builder run every core. A small extension fits anywhere.
RUNNER_LABELS: Mapping[str, str] = {"flash-attn": "mem-256g"}
DEFAULT_LABEL = "mem-64g"


def runner_label(package: str) -> str:
    return RUNNER_LABELS.get(canonicalize_name(package), DEFAULT_LABEL)


def label_matrix(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Add the runner label to each ``include`` entry (matched to its cell by id)."""
    packages = {c["id"]: c["package"] for c in doc.get("cells", [])}
    include = []
    for entry in doc.get("include", []):
        package = packages.get(entry["cell"]) or entry["cell"]
        include.append({**entry, "runner": runner_label(package)})
    return {**doc, "include": include}


def builder_slots(doc: Mapping[str, Any], builder: str) -> list[str]:
    """``MEMORY CPUS CELL...`` per non-empty slot of ``builder`` in a schedule."""
    lines = []
    for b in doc.get("builders", []):
        if b["name"] != builder:
            continue
        for slot in b["slots"]:
            if slot["cells"]:
                lines.append(" ".join([slot["memory"], str(slot["cpus"]), *slot["cells"]]))
    return lines


USAGE = ("usage: python -m factory.ci runner-labels < matrix.json\n"
         "       python -m factory.ci builder-slots NAME < schedule.json")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not (args == ["runner-labels"] or (len(args) == 2 and args[0] == "builder-slots")):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        doc = json.load(sys.stdin)
    except ValueError as exc:
        print(f"ERROR the input is not 'factory {'matrix' if len(args) == 1 else 'schedule'} "
              f"--json' output: {exc}", file=sys.stderr)
        return 2
    if args[0] == "builder-slots":
        for line in builder_slots(doc, args[1]):
            print(line)
        return 0
    json.dump(label_matrix(doc), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
