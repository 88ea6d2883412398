"""What the GitHub Actions workflows need that the CLI does not print: the ``runs-on`` labels of
their jobs, taken from the builders of ``.github/builders.toml``, and one builder's slots of a
schedule.

Each builder's self-hosted runner carries ``self-hosted``, ``linux``, the CPU label of its
platform (``x64`` or ``arm64``, GitHub's names for the runner's machine), its builder's name and
the builder's ``labels``. A job asks for ``[self-hosted, linux, CPU, LABEL]``, so every label
given out here is one some builder carries, for a platform that builds the cell
(``tests/unit/test_workflows.py`` checks every label any workflow can ask for).

``python -m factory.ci builder-jobs [--builders FILE] < schedule.json`` reads
``factory schedule --json`` output and prints its ``include`` list with each builder's ``cpu``
label added: the nightly build job's matrix.

``python -m factory.ci builder-slots NAME < schedule.json`` prints one line per slot of builder
NAME: ``MEMORY CPUS CELL...``, the cells in build order (a later one takes the earlier one's
kernels from the compile cache).

``runs_on`` answers for a one-off request (``factory request --print-cell --json``). Any cell
builds in any memory (the planner lowers MAX_JOBS to fit); the label only decides how fast.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from factory.errors import ConfigError, FactoryError
from factory.planning.builders import Builder, load_builders

DEFAULT_BUILDERS = Path(".github/builders.toml")
# GitHub's label for the machine a self-hosted runner runs on, by the builder's platform.
CPU_LABELS: Mapping[str, str] = {"x86_64": "x64", "aarch64": "arm64"}
# flash-attn: about 4.5 GB per concurrently compiling arch (measured: docs/BENCHMARKS.md); 256 GB
# lets a 32-core builder run every core. A package not named here takes the smallest builder.
PACKAGE_LABELS: Mapping[str, str] = {"flash-attn": "mem-256g"}


def cpu_label(platform: str) -> str:
    try:
        return CPU_LABELS[platform]
    except KeyError:
        raise ConfigError(f"no runner CPU label for platform {platform!r} "
                          f"(known: {', '.join(CPU_LABELS)})") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunsOn:
    cpu: str  # "x64"
    label: str  # a builder's name or one of its labels
    builder: str  # the builder it was chosen from

    def labels(self) -> list[str]:
        return ["self-hosted", "linux", self.cpu, self.label]


def runs_on(package: str, platform: str, builders: Sequence[Builder]) -> RunsOn:
    """The runner labels for building one cell of ``package`` for ``platform``: a builder that
    builds the platform (natively first, else one that cross-builds it) and carries the
    package's label, else the smallest such builder by its name."""
    able = [b for b in builders if b.builds(platform)]
    if not able:
        raise ConfigError(f"no builder in the builders file builds {platform} cells")
    able.sort(key=lambda b: (b.platform != platform, b.memory_bytes, b.name))
    want = PACKAGE_LABELS.get(canonicalize_name(package))
    if want is not None:
        for b in able:
            if want in b.labels:
                return RunsOn(cpu=cpu_label(b.platform), label=want, builder=b.name)
    b = able[0]
    return RunsOn(cpu=cpu_label(b.platform), label=b.name, builder=b.name)


def builder_jobs(doc: Mapping[str, Any], builders: Sequence[Builder]) -> list[dict[str, Any]]:
    """A schedule's ``include`` (one entry per builder with work) with each builder's CPU label."""
    by_name = {b.name: b for b in builders}
    out = []
    for entry in doc.get("include", []):
        b = by_name.get(str(entry.get("builder")))
        if b is None:
            raise ConfigError(f"the schedule names builder {entry.get('builder')!r}, which the "
                              "builders file does not have")
        out.append({**entry, "cpu": cpu_label(b.platform)})
    return out


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


USAGE = ("usage: python -m factory.ci builder-jobs [--builders FILE] < schedule.json\n"
         "       python -m factory.ci builder-slots NAME < schedule.json")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    jobs = args[:1] == ["builder-jobs"] and (len(args) == 1 or (len(args) == 3
                                                                and args[1] == "--builders"))
    if not (jobs or (len(args) == 2 and args[0] == "builder-slots")):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        doc = json.load(sys.stdin)
    except ValueError as exc:
        print(f"ERROR the input is not 'factory schedule --json' output: {exc}", file=sys.stderr)
        return 2
    if args[0] == "builder-slots":
        for line in builder_slots(doc, args[1]):
            print(line)
        return 0
    try:
        builders = load_builders(Path(args[2]) if len(args) == 3 else DEFAULT_BUILDERS)
        json.dump(builder_jobs(doc, builders), sys.stdout)
    except FactoryError as exc:
        print(f"ERROR {exc.message}", file=sys.stderr)
        return exc.exit_code
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
