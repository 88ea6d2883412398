"""factory doctor [--index URL] [--package NAME] [--python EXE] [--cert FILE]
                 [--nvidia-smi-output FILE] [--machine CPU] [--json] [--format pip|uv|poetry|pdm]

``--format`` prints the installer configuration for the chosen builds instead of the report;
the warnings stay, as comments, and when nothing fits the reasons do.

Exit status: 0 when a wheel fits (or no index was given), 1 when the index has nothing that fits
this host (the reason is printed, in every format), other codes for errors.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from factory.commands._common import add_cert_arg, print_json
from factory.environment import INDEX_URL_ENV, env_value
from factory.hosts.doctor import NO_FIT_EXIT, DoctorReport, diagnose, render_text
from factory.hosts.probe import read_host
from factory.hosts.snippets import FORMATS, render_snippet


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--index", default=None,
        help=f"the factory index: its root URL or directory (default: ${INDEX_URL_ENV})",
    )
    parser.add_argument("--package", action="append", default=None,
                        help="only these projects (default: every project on the index)")
    parser.add_argument("--python", default=None, metavar="EXE",
                        help="the interpreter whose torch to read and that the line installs "
                             "into (default: the python3 on PATH)")
    add_cert_arg(parser, verifies=True)
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


def _snippet(fmt: str, report: DoctorReport) -> str:
    """The installer's snippet; the projects nothing fits for are named in comments."""
    missing = [f"# no wheel fits: {c.project}: {c.why}" for c in report.choices if not c.wheel]
    if not report.ok:
        warnings = [f"# WARNING {w}" for w in report.all_warnings()]
        return "\n".join([*warnings, *missing]) + "\n"
    assert report.access is not None
    text = render_snippet(fmt, report.fitting, report.access, report.host,
                          warnings=report.all_warnings())
    return text + "".join(f"{line}\n" for line in missing)


def run(args: argparse.Namespace) -> int:
    host = read_host(python_exe=args.python, nvidia_smi_output=args.nvidia_smi_output,
                     machine=args.machine)
    report = diagnose(host, args.index or env_value(INDEX_URL_ENV), args.package or (),
                      cert=args.cert)
    if args.format and report.choices:
        print(_snippet(args.format, report), end="")
    elif args.json:
        print_json(report.as_dict())
    else:
        print(render_text(report))
    if report.choices and not report.ok:
        return NO_FIT_EXIT
    return 0
