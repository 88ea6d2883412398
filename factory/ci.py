"""What the GitHub Actions workflows need that the CLI does not print: the self-hosted runner
label (by memory size) each cell should build on.

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

# flash-attn: about 4.5 GB per concurrently compiling arch (measured: docs/BENCHMARKS.md); 256 GB lets a
# 32-core builder run every core. A small extension fits anywhere.
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


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["runner-labels"]:
        print("usage: python -m factory.ci runner-labels < matrix.json", file=sys.stderr)
        return 2
    try:
        doc = json.load(sys.stdin)
    except ValueError as exc:
        print(f"ERROR the input is not 'factory matrix --json' output: {exc}", file=sys.stderr)
        return 2
    json.dump(label_matrix(doc), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
