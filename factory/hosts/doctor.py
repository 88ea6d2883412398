"""The host doctor: read this host, then find the index's wheel that fits it and the exact install
line, or say exactly why none fits.

Check, then decide, then say: ``factory.hosts.probe`` reads the host into a frozen ``HostInfo``
(nothing is decided there); ``factory.hosts.index_reader`` reads the index's PEP 503 pages;
``factory.hosts.choose`` narrows the index's files step by step and words why none fits; this
module runs the three for every project and renders the report; ``factory.hosts.snippets``
words the install line and the installers' configuration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from factory.hosts.choose import Choice, choose
from factory.hosts.index_reader import IndexAccess, IndexReader
from factory.hosts.probe import HostInfo, driver_max_cuda
from factory.hosts.snippets import pip_command, pip_interpreter
from factory.matrix.cell import arch_cc, sm_name
from factory.matrix.manylinux import glibc_text

NO_FIT_EXIT = 1  # the doctor ran fine but no wheel fits: scripts branch on this


@dataclasses.dataclass(frozen=True, kw_only=True)
class DoctorReport:
    host: HostInfo
    index: str | None
    choices: tuple[Choice, ...]
    warnings: tuple[str, ...]
    access: IndexAccess | None = None  # how installers reach the index

    @property
    def ok(self) -> bool:
        return any(c.wheel for c in self.choices)

    @property
    def fitting(self) -> tuple[Choice, ...]:
        return tuple(c for c in self.choices if c.wheel)

    def all_warnings(self) -> list[str]:
        """Every warning, each choice's named by its project: what every format keeps."""
        return [f"{c.project}: {w}" for c in self.choices for w in c.warnings] + list(self.warnings)

    def install_lines(self, choice: Choice) -> list[str]:
        """The comment lines and the pip command that install ``choice``; [] when none fits."""
        if not choice.wheel or self.access is None:
            return []
        return pip_command([choice], self.access, pip_interpreter(self.host))

    def as_dict(self) -> dict[str, Any]:
        results = []
        for c in self.choices:
            lines = self.install_lines(c)
            results.append({**c.as_dict(), "install": lines[-1] if lines else None,
                            "install_comments": lines[:-1]})
        return {
            "host": self.host.as_dict(),
            "index": self.index,
            "results": results,
            "warnings": list(self.warnings),
        }


def diagnose(host: HostInfo, index: str | None, packages: Sequence[str] = (), *,
             cert: Path | None = None) -> DoctorReport:
    if index is None:
        return DoctorReport(
            host=host, index=None, choices=(),
            warnings=("no --index given: pass the index URL to get an install line",),
        )
    reader = IndexReader(index, cert=cert)
    projects = [canonicalize_name(p) for p in packages] or reader.projects()
    choices = []
    for project in projects:
        files = reader.files(project)
        if files is None and host.variant:
            files = reader.files(project, host.variant)
        choices.append(choose(host, project, files or [], reader))
    return DoctorReport(host=host, index=reader.root_url, choices=tuple(choices), warnings=(),
                        access=IndexAccess(url=reader.root_url, cert=cert))


def render_text(report: DoctorReport) -> str:
    h = report.host
    lines = ["host"]
    lines.append(f"  python      {h.python} ({h.python_exe}: {h.python_source})")
    if h.torch:
        cuda = f"CUDA {h.torch_cuda}" if h.torch_cuda else "CPU-only"
        local = f"+{h.torch_local}" if h.torch_local else ""
        lines.append(f"  torch       {h.torch}{local} ({cuda})")
    else:
        lines.append(f"  torch       not importable: {h.torch_error or 'not installed'}")
    if h.gpus:
        top = driver_max_cuda(h.driver) if h.driver else None
        lines.append(f"  driver      {h.driver or 'unknown'}"
                     + (f" (CUDA up to {top})" if top else ""))
        for i, g in enumerate(h.gpus):
            lines.append(f"  gpu {i:<7} {g.name}, {sm_name(g.sm)} "
                         f"(compute capability {arch_cc(g.sm)})")
        lines.append(f"  read from   {h.gpu_source}")
    else:
        lines.append(f"  gpu         none found ({h.gpu_note or 'no NVIDIA GPU'})")
    lines.append(f"  glibc       {glibc_text(h.glibc) if h.glibc else 'unknown'} ({h.machine})")
    if h.grace:
        lines.append(f"  platform    {h.machine}: a Grace host ({h.grace}); "
                     "wheels must be *_aarch64")
    lines.append(f"  variant     {h.variant or '-'}")
    if report.index:
        lines.append(f"index {report.index}")
    for c in report.choices:
        lines.append("")
        for w in c.warnings:
            lines.append(f"WARNING {c.project}: {w}")
        if c.wheel:
            lines.append(f"{c.project}: {c.wheel}")
            lines += [f"  {line}" for line in report.install_lines(c)]
        else:
            lines.append(f"{c.project}: no wheel fits: {c.why}")
    for w in report.warnings:
        lines.append(f"WARNING {w}")
    return "\n".join(lines)
