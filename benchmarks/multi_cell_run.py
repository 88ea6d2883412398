"""A real multi-cell run: `factory schedule`'s predicted makespan against the measured one.

Two "builders" on this machine, each a set of `factory build` processes with its own memory
and CPU cap, work dir, compile cache and memory history, publishing to one S3 store (moto, on
loopback), run exactly as nightly.yml runs them: `factory schedule --json`, then per builder
one `factory build CELLS --memory M --cpus C --cache --publish` per slot of
`python -m factory.ci builder-slots NAME`, side by side.

The prediction may use only what a builder had before the run: the shipped history plus one
calibration build of the bundled example on this machine (``--calibrate``, a cell that is not
in the run; its object times, peaks and run go into the history by the build itself, and its
overhead, whole build minus ninja's span, is added as the recipe's measured ``cell_overhead``).
The cells of the run are the bundled example for other archs (one group each, so no cell takes
another's kernels from the cache).

    python benchmarks/multi_cell_run.py --dir SCRATCH --results DIR \\
        [--archs 8.0 9.0 12.0 8.6] [--builder b1:6g:1 --builder b2:6g:1] [--calibrate 10.0]

Writes DIR/run.json (prediction, schedule, per-cell and per-slot measurements, the machine's
load) and DIR/<cell>.ninja_log. Run it alone on the machine (nothing else compiling): the
builders' CPU caps are docker CPU quotas, not reserved cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from index_fixtures import S3_ENV, _SerialWrites  # noqa: E402  (moto with S3's semantics)

from factory.planning.ninja_log import compile_span, read_entries  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "multicell"
CACHE = ROOT / ".cache" / "factory"


def moto() -> tuple[str, Any]:
    """An S3 API server on loopback in a thread: (its URL, the server: shut it down)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, _SerialWrites(
        DomainDispatcherApplication(create_backend_app)), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def matrix_text(*, work: Path, history: Path, archs: list[str], pythons: list[str]) -> str:
    arch_list = ", ".join(f'["{a}"]' for a in archs)
    py_list = ", ".join(f'"{p}"' for p in pythons)
    return f"""version = 1
[settings]
wheelhouse = "{CACHE / 'wheelhouse'}"
venv-dir = "{CACHE / 'venvs'}"
work-dir = "{work}"
memory-history = "{history}"
runner = "docker"

[axes]
torch = ["2.14.1"]
cuda = ["13.0"]
archs = [{arch_list}]
python = [{py_list}]

[packages.factory-example-ext]
recipe = "torch-extension"
versions = ["0.1.0"]
source = "{ROOT / 'tests' / 'example_ext'}"
"""


def builder_dir(scratch: Path, name: str, history_seed: Path | None,
                archs: list[str], pythons: list[str]) -> Path:
    """A builder's own work dir, compile cache and history; the toolkit, sysroot, build venvs
    and wheelhouse it was provisioned with are the machine's (links, read as they are)."""
    d = scratch / name
    (d / "work").mkdir(parents=True, exist_ok=True)
    for shared in ("toolkits", "sysroots"):
        link = d / shared
        if not link.exists():
            link.symlink_to(CACHE / shared)
    history = d / "history.json"
    if history_seed is not None:
        shutil.copy(history_seed, history)
    (d / "matrix.toml").write_text(matrix_text(work=d / "work", history=history, archs=archs,
                                               pythons=pythons))
    return d


def factory(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    fh = log.open("wb")
    return subprocess.Popen([sys.executable, "-m", "factory", *args], stdout=fh,
                            stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def cell_record(work: Path, cell: str, out: Path) -> dict[str, Any]:
    """What one cell's build measured: whole build (provenance), ninja's span, its log."""
    prov = sorted(out.glob("*.provenance.json"))
    doc = next((json.loads(p.read_text()) for p in prov
                if json.loads(p.read_text())["cell"]["id"] == cell), None)
    logs = sorted((work / cell / "src").glob("build/temp*/.ninja_log"))
    entries = [e for log in logs for e in read_entries(log)]
    return {"cell": cell, "build_seconds": doc["build_seconds"] if doc else None,
            "compile_seconds": round(compile_span(entries), 1) if entries else None,
            "objects": len(entries), "attempts": doc["attempts"] if doc else None,
            "ninja_log": logs[0] if logs else None}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True, help="scratch dir (made, left behind)")
    ap.add_argument("--results", type=Path, required=True, help="where run.json goes")
    ap.add_argument("--archs", nargs="+", default=["8.0", "9.0", "12.0", "8.6"])
    ap.add_argument("--python", nargs="+", default=["3.11"])
    ap.add_argument("--builder", action="append", default=None, metavar="NAME:MEMORY:CPUS")
    ap.add_argument("--calibrate", default="10.0", help="arch of the calibration build")
    args = ap.parse_args(argv)
    builders = [b.split(":") for b in (args.builder or ["b1:6g:1", "b2:6g:1"])]
    scratch = args.dir.resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    endpoint, server = moto()
    try:
        return _run(args, builders, scratch, endpoint)
    finally:
        server.shutdown()  # while its thread still runs (not at interpreter exit)


def _run(args: argparse.Namespace, builders: list[list[str]], scratch: Path,
         endpoint: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FACTORY_"))}
    env.update({**S3_ENV, "FACTORY_S3_ENDPOINT_URL": endpoint})
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"]).create_bucket(
        Bucket=BUCKET)
    store = f"s3://{BUCKET}/wheels"
    record: dict[str, Any] = {"version": 1, "date": time.strftime("%Y-%m-%d"),
                              "cpus": os.cpu_count(), "builders": builders,
                              "archs": args.archs, "python": args.python}

    # 1. calibration: one build of a cell outside the run, recorded by the factory itself
    calibrated = scratch / "calibrated.json"
    cal = builder_dir(scratch, "calibrate", None, [args.calibrate], args.python[:1])
    cal_history = cal / "history.json"
    cal_cell = (f"factory-example-ext-0.1.0-torch2.14.1-cu130-sm"
                f"{args.calibrate.replace('.', '')}-cp{args.python[0].replace('.', '')}")
    memory, cpus = builders[0][1], builders[0][2]
    t0 = time.monotonic()
    rc = factory("build", cal_cell, "--matrix", str(cal / "matrix.toml"), "--memory", memory,
                 "--cpus", cpus, "--cache", "--out", str(cal / "dist"), "--force",
                 env=env, log=cal / "build.log").wait()
    if rc != 0:
        print(f"calibration build failed (rc {rc}); see {cal / 'build.log'}", file=sys.stderr)
        return 1
    c = cell_record(cal / "work", cal_cell, cal / "dist")
    overhead = c["build_seconds"] - c["compile_seconds"]
    doc = json.loads(cal_history.read_text())
    shipped = json.loads((ROOT / "factory" / "data" / "memory_history.json").read_text())
    doc.setdefault("defaults", {})["torch-extension"] = {
        **shipped["defaults"]["torch-extension"],
        "cell_overhead": [{"seconds": round(overhead, 1),
                           "source": f"calibration build {cal_cell}: build "
                           f"{c['build_seconds']} s - compile {c['compile_seconds']} s"}]}
    calibrated.write_text(json.dumps(doc, indent=1))
    record["calibration"] = {**c, "ninja_log": None, "overhead_seconds": round(overhead, 1),
                             "wall_seconds": round(time.monotonic() - t0, 1)}

    # 2. the prediction, from the calibrated history only
    dirs = {name: builder_dir(scratch, name, calibrated, args.archs, args.python)
            for name, _, _ in builders}
    btoml = scratch / "builders.toml"
    btoml.write_text("".join(f'[[builder]]\nname = "{n}"\nmemory = "{m}"\ncpus = {c}\n'
                             f'platform = "x86_64"\n\n' for n, m, c in builders))
    first = dirs[builders[0][0]] / "matrix.toml"
    sched = subprocess.run([sys.executable, "-m", "factory", "schedule", "--matrix", str(first),
                            "--builders", str(btoml), "--json"], env={
                                **env, "FACTORY_MEMORY_HISTORY": str(calibrated)},
                           capture_output=True, text=True, cwd=ROOT, check=True).stdout
    (scratch / "schedule.json").write_text(sched)
    schedule = json.loads(sched)
    record["schedule"] = schedule
    record["predicted_makespan_seconds"] = schedule["makespan_seconds"]

    # 3. the run: per builder, one build per slot, side by side, as nightly.yml does
    procs: list[tuple[str, int, list[str], subprocess.Popen[bytes], float]] = []
    start = time.monotonic()
    load_before = os.getloadavg()
    for name, _, _ in builders:
        slots = subprocess.run([sys.executable, "-m", "factory.ci", "builder-slots", name],
                               input=sched, capture_output=True, text=True, cwd=ROOT,
                               check=True).stdout.splitlines()
        for i, line in enumerate(slots):
            mem, cpu, *cells = line.split()
            d = dirs[name]
            p = factory("build", *cells, "--matrix", str(d / "matrix.toml"), "--memory", mem,
                        "--cpus", cpu, "--cache", "--publish", "--store", store, "--json",
                        "--out", str(d / "dist"), env=env, log=d / f"slot-{i}.log")
            procs.append((name, i, cells, p, time.monotonic()))
    ended: dict[int, float] = {}
    while len(ended) < len(procs):  # each slot's end as it happens, whichever ends first
        for k, (_, _, _, p, _) in enumerate(procs):
            if k not in ended and p.poll() is not None:
                ended[k] = time.monotonic() - start
        time.sleep(1.0)
    slots_out: list[dict[str, Any]] = [
        {"builder": name, "slot": i, "cells": cells, "rc": p.returncode,
         "started": round(began - start, 1), "ended": round(ended[k], 1)}
        for k, (name, i, cells, p, began) in enumerate(procs)]
    measured = max(ended.values())
    record["measured_makespan_seconds"] = round(measured, 1)
    record["load_average_before"] = load_before
    record["load_average_after"] = os.getloadavg()
    record["slots"] = slots_out
    cells_out = []
    for name, _i, cells, _, _ in procs:
        for cell in cells:
            rec = cell_record(dirs[name] / "work", cell, dirs[name] / "dist")
            if rec["ninja_log"]:
                shutil.copy(rec["ninja_log"], args.results / f"{cell}.ninja_log")
            cells_out.append({**rec, "builder": name, "ninja_log": f"{cell}.ninja_log"})
    record["cells"] = cells_out
    check = subprocess.run([sys.executable, "-m", "factory", "index", "verify", "--store",
                            store], env=env, capture_output=True, text=True, cwd=ROOT)
    record["index_verify"] = {"rc": check.returncode, "out": check.stdout.strip()[-400:]}
    (args.results / "run.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    pred = record["predicted_makespan_seconds"]
    print(f"predicted makespan {pred:.0f} s, measured {measured:.0f} s "
          f"({100 * (pred / measured - 1):+.1f} %); slots: "
          + "; ".join(f"{s['builder']}/{s['slot']} rc {s['rc']} {s['ended']:.0f} s"
                      for s in slots_out))
    return 0 if all(s["rc"] == 0 for s in slots_out) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
