"""factory work --store STORE [--memory SIZE] [--cpus N] [--matrix PATH] [--package P]
[--runner R] [--cache] [--lease-ttl S] [--no-wait]: the work-queue mode (engines.queue)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from factory.build.job import BuildOptions
from factory.build.lease import LEASE_TTL_SECONDS, POLL_SECONDS
from factory.commands._common import (
    add_matrix_arg,
    add_runner_arg,
    add_store_arg,
    matrix_from_args,
    store_from_args,
)
from factory.commands.build import outcomes_json, summarize
from factory.engines.queue import WorkerCaps, run_queue
from factory.errors import UsageError
from factory.logger import Log
from factory.matrix.cell import PLATFORMS
from factory.planning.budget import requested_budget
from factory.runners import kinds_taking, runner_kind
from factory.toolchain.cross import builder_platform
from factory.units import format_size


def configure(parser: argparse.ArgumentParser) -> None:
    add_matrix_arg(parser)
    add_store_arg(parser)
    parser.add_argument("--memory", default=None, metavar="SIZE",
                        help="this worker's memory (default: detected: its cgroup's limit, "
                        "e.g. a Slurm allocation or a pod's, else the host's)")
    parser.add_argument("--cpus", type=int, default=None, metavar="N",
                        help="this worker's CPUs (default: detected)")
    parser.add_argument("--platform", default=None, metavar="CPU",
                        help="this worker's CPU (default: this machine's, e.g. x86_64)")
    parser.add_argument("--package", action="append", default=None, help="only these packages")
    add_runner_arg(parser)
    parser.add_argument("--uncapped", action="store_true",
                        help=f"{kinds_taking('uncapped')} runner: no cgroup of its own (the "
                        "allocation is the cap)")
    parser.add_argument("--cache", action="store_true", help="use the compile cache (sccache)")
    parser.add_argument("--out", type=Path, default=Path("dist"),
                        help="where the wheels go before they are published (default: dist/)")
    parser.add_argument("--lease-ttl", type=float, default=None, metavar="SECONDS",
                        help="group and cell leases' time to live (default 900)")
    parser.add_argument("--poll", type=float, default=None, metavar="SECONDS",
                        help="how often to look again while other workers hold everything "
                        "that fits (default 30)")
    parser.add_argument("--no-wait", action="store_true",
                        help="stop when everything that fits is held by other workers, instead "
                        "of waiting for it to be published or its worker's lease to expire")
    parser.add_argument("--no-import-check", action="store_true",
                        help="skip the clean-venv import check")
    parser.add_argument("--json", action="store_true", help="print the outcomes as JSON")


def run(args: argparse.Namespace) -> int:
    for flag in ("lease_ttl", "poll"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive, not {value:g}")
    if args.platform is not None and args.platform not in PLATFORMS:
        raise UsageError(f"unknown --platform {args.platform!r}; known: {', '.join(PLATFORMS)}")
    matrix = matrix_from_args(args)
    runner = args.runner or matrix.settings.runner
    if args.uncapped and "uncapped" not in runner_kind(runner).options:
        raise UsageError(f"--uncapped applies to the {kinds_taking('uncapped')} runner only")
    request = requested_budget(matrix.settings, memory=args.memory, cpus=args.cpus)
    found = request.resolve()
    store = store_from_args(args)
    ttl = args.lease_ttl or LEASE_TTL_SECONDS
    opts = BuildOptions(runner=runner, budget=request, out_dir=args.out, store=store,
                        publish=True, cache=args.cache, verbose=args.verbose,
                        verify_import=not args.no_import_check, lease_ttl=ttl,
                        runner_options={"uncapped": True} if args.uncapped else {})
    caps = WorkerCaps(memory_bytes=found.memory_bytes, cpus=found.cpus,
                      machine=args.platform or builder_platform())
    log = Log()
    log.step(f"worker: {format_size(found.memory_bytes)} ({found.memory_source}), "
             f"{found.cpus} CPU(s) ({found.cpus_source}), {caps.machine}, store {store}")
    report = run_queue(matrix, caps=caps, opts=opts, log=log, packages=args.package, ttl=ttl,
                       poll=args.poll or POLL_SECONDS, wait=not args.no_wait)
    for line in report.not_fitting:
        log.detail(f"not for this worker: {line}")
    summarize(log, list(report.outcomes), list(report.failed), published_to=store)
    log.detail(f"{report.groups_built} group(s) built here; nothing left that fits this worker")
    if args.json:
        json.dump({"version": 1, "outcomes": outcomes_json(list(report.outcomes)),
                   "failed": [{"group": g, "error": e.message} for g, e in report.failed],
                   "not_fitting": list(report.not_fitting)}, sys.stdout, indent=2)
        print()
    return report.failed[0][1].exit_code if report.failed else 0
