"""factory doctor [--index URL] [--package NAME] [--python EXE] [--nvidia-smi-output FILE]
                 [--machine CPU] [--json] [--format pip|uv|poetry|pdm]

``--format`` prints the installer configuration for the chosen builds instead of the report.

Exit status: 0 when a wheel fits (or no index was given), 1 when the index has nothing that fits
this host (the reason is printed), other codes for errors.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from factory.commands._common import print_json
from factory.hosts.doctor import NO_FIT_EXIT, diagnose, read_host, render_text
from factory.hosts.snippets import FORMATS, render_snippet

INDEX_ENV = "FACTORY_INDEX_URL"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--index", default=None,
        help=f"the factory index: its root URL or directory (default: ${INDEX_ENV})",
    )
    parser.add_argument("--package", action="append", default=None,
                        help="only these projects (default: every project on the index)")
    parser.add_argument("--python", default=None, metavar="EXE",
                        help="the interpreter whose torch to read (default: this one)")
    parser.add_argument("--nvidia-smi-output", type=Path, default=None, metavar="FILE",
                        help="a recorded 'nvidia-smi --query-gpu=name,compute_cap,driver_version "
                             "--format=csv,noheader' output to use instead of this host's GPUs")
    parser.add_argument("--machine", default=None, metavar="CPU",
                        help="answer for a host of this CPU (x86_64, aarch64) instead of this "
                             "one's, e.g. with --nvidia-smi-output of a Grace host")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="print the config snippet for this installer (pip.conf, or the "
                             "pyproject.toml sections for uv, Poetry or PDM)")


def run(args: argparse.Namespace) -> int:
    host = read_host(python_exe=args.python, nvidia_smi_output=args.nvidia_smi_output,
                     machine=args.machine)
    report = diagnose(host, args.index or os.environ.get(INDEX_ENV) or None, args.package or ())
    if args.format and report.ok:
        print(render_snippet(args.format, report.choices, torch=host.torch), end="")
    elif args.json:
        print_json(report.as_dict())
    else:
        print(render_text(report))
    if report.choices and not report.ok:
        return NO_FIT_EXIT
    return 0
