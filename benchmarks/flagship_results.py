"""Collect one real `factory build` of a cell into the repo, and ship its figures to the planner.

``collect``: from the cell's build tree and logs (the work dir), the wheel's provenance (the
out dir) and the container's CPU seconds (benchmarks/container_cpu.py), one JSON of what the
build measured: the plan it ran with, ninja's compile span and every object's seconds, the
sampler's per-object peak RSS (objects of ninja's log only), the compilers' summed peak, the
cgroup's peaks, the whole build and the overhead outside the compile, the cache's hits, the
wheel. Paths of the build machine are cut to the part below the work dir. The ninja log is
copied beside it.

``ship``: that JSON into factory/data/memory_history.json as the cell's own objects entry
(seconds, peaks, the run as a whole: the planner then plans this cell from its own data and
takes its range from the recorded runs of these objects) and its overhead into the recipe's
``cell_overhead``; ``--runs FILE`` adds the other recorded runs of the same arch set from
``benchmarks/replay_real_runs.py --history-runs`` output (e.g. the sm_100 H200 run). With
``--fold``, folded in as a builder folds a build it ran instead: the times become this run's,
and the entry's earlier times and runs stay as its recorded runs (the flagship's rebuild).

    python benchmarks/flagship_results.py collect CELL --work WORK_DIR --dist DIST \\
        [--cpu cpu.json] [--name TEXT] --out benchmarks/results-2026-12-01-flagship/cp311.json
    python benchmarks/flagship_results.py ship benchmarks/results-2026-12-01-flagship/cp311.json \
        [--runs runs.json]
    python benchmarks/flagship_results.py ship --fold \
        benchmarks/results-2026-12-02-flagship/cp311-again.json \
        --earlier benchmarks/results-2026-12-01-flagship/cp311.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.matrix.cell import Cell  # noqa: E402
from factory.planning.memory_model import BuildMeasurement, MemoryHistory  # noqa: E402
from factory.planning.ninja_log import compile_span, read_entries, stages_of  # noqa: E402
from factory.planning.object_times import RecordedRun  # noqa: E402
from factory.planning.record import machine, object_peaks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "factory" / "data" / "memory_history.json"


def _cut(text: str, work: Path) -> str:
    """A path of the build machine, cut to what is below the work dir."""
    return text.replace(str(work.resolve()), "<work>").replace(str(work), "<work>")


def collect(cell: str, work: Path, dist: Path, cpu: Path | None, name: str,
            out: Path) -> dict[str, Any]:
    tree = work / cell
    logs = sorted((tree / "src").glob("build/temp*/.ninja_log"))
    if not logs:
        raise SystemExit(f"no ninja log under {tree / 'src'}")
    entries = [e for log in logs for e in read_entries(log)]
    seconds = {e.key: round(e.seconds, 3) for e in entries}
    prov = next((json.loads(p.read_text()) for p in sorted(dist.glob("*.provenance.json"))
                 if json.loads(p.read_text())["cell"]["id"] == cell), None)
    if prov is None:
        raise SystemExit(f"no provenance of {cell} in {dist}")
    good = prov["attempts"][-1]
    attempt_log = Path(str(good["log"]))
    report_path = tree / "logs" / (attempt_log.name + ".report.json")
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    peaks = object_peaks(report.get("object_peak_rss_bytes") or {}, seconds)
    span = compile_span(entries)
    doc: dict[str, Any] = {
        "version": 1, "name": name, "cell": cell, "date": prov["created"][:10],
        "machine": machine(), "runner": prov["builder"].get("runner"),
        "image": prov["builder"].get("image"), "jobs": good["max_jobs"],
        "nvcc_threads": good["nvcc_threads"], "cpus": prov["plan"]["cpus"],
        "memory_limit_bytes": good["memory_limit_bytes"],
        "plan": {k: prov["plan"].get(k) for k in ("max_jobs", "predicted_seconds",
                                                 "predicted_peak_bytes", "reasons")},
        "attempts": [{k: v for k, v in a.items() if k != "log"} for a in prov["attempts"]],
        "compile_seconds": round(span, 1), "objects": len(entries),
        "object_seconds_sum": round(sum(seconds.values()), 1),
        "build_seconds": prov["build_seconds"],
        "overhead_seconds": round(prov["build_seconds"] - span, 1),
        "compile_peak_rss_bytes": good.get("compile_peak_rss_bytes"),
        "cgroup_anon_peak_bytes": report.get("cgroup_anon_peak_bytes"),
        "cgroup_peak_bytes": report.get("cgroup_peak_bytes"),
        "install_seconds": report.get("install_seconds"),
        "cache": {k: report.get(k) for k in ("cache_hits", "cache_misses", "sccache_hits",
                                             "direct_cache")},
        "wheel": prov["wheel"], "sha256": prov["sha256"],
        "ninja_log": f"{out.stem}.ninja_log",
        "object_seconds": seconds, "object_peak_rss_bytes": peaks,
    }
    if cpu is not None and cpu.exists():
        doc["container_cpu_seconds"] = json.loads(cpu.read_text())["cpu_seconds"]
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(logs[0], out.with_suffix(".ninja_log"))
    text = _cut(json.dumps(doc, indent=1), work)
    out.write_text(text + "\n")
    return doc


def ship(result: Path, runs_file: Path | None) -> None:
    doc = json.loads(result.read_text())
    shipped = json.loads(SHIPPED.read_text())
    archs = sorted({int(a) for a in doc["cell"].split("-sm")[1].split("-")[0].split("+sm")})
    run = RecordedRun(source=f"{doc['name']} ({doc['cell']})", date=doc["date"],
                      max_jobs=doc["jobs"], cpus=doc["cpus"],
                      compile_seconds=doc["compile_seconds"],
                      peak_bytes=doc["compile_peak_rss_bytes"], peak_of="compilers",
                      machine=doc["machine"],
                      order=tuple(o.key for o in read_entries(result.with_suffix(".ninja_log"))),
                      supplied_times=True)  # the entry's seconds are this run's
    others = json.loads(runs_file.read_text()) if runs_file else {}
    earlier = [r for r in others.get("+".join(map(str, archs)), [])
               if (r["max_jobs"], r["cpus"], r["compile_seconds"])
               != (run.max_jobs, run.cpus, run.compile_seconds)]  # not this run again
    entry = {
        "package": "flash-attn", "version": "2.8.3.post2", "cuda": "13.0", "archs": archs,
        "nvcc_threads": doc["nvcc_threads"], "max_jobs": doc["jobs"], "cpus": doc["cpus"],
        "source": f"{doc['name']}: {result.with_suffix('.ninja_log').name}",
        "updated": doc["date"], "seconds": doc["object_seconds"],
        "peak_bytes": doc["object_peak_rss_bytes"],
        "peak_source": "the runners' sampler: each object's own largest RSS",
        "runs": earlier + [run.as_dict()],
    }
    objects = [e for e in shipped["objects"] if not (
        e["package"] == entry["package"] and e["archs"] == archs
        and int(e.get("nvcc_threads", 1)) == entry["nvcc_threads"])]
    shipped["objects"] = objects + [entry]
    over = shipped["defaults"]["flash-attn"].setdefault("cell_overhead", [])
    over[:] = [o for o in over if doc["cell"] not in o.get("source", "")] + [{
        "seconds": doc["overhead_seconds"],
        "source": f"{doc['cell']}, {doc['date']}, {doc['runner']} runner, {doc['machine']}: "
                  f"build {doc['build_seconds']} s - compile {doc['compile_seconds']} s"}]
    SHIPPED.write_text(json.dumps(shipped, indent=1) + "\n")


def _cpu(doc: dict[str, Any]) -> float | None:
    """The build container's CPU seconds (benchmarks/container_cpu.py): the compile's and
    the 2-3 % of the build around it; what a run record's ``cpu_seconds`` holds for a build
    measured before the runners' sampler read its cgroup's CPU time."""
    cpu = doc.get("container_cpu_seconds")
    return round(float(cpu["total"]), 1) if isinstance(cpu, dict) else None


def fold(result: Path, earlier: list[Path]) -> None:
    """That JSON folded into the shipped history as a builder folds a build it ran
    (record_build): the entry's object times become this run's, the run that supplied the old
    ones keeps them (a plan for a machine like it takes them), this run joins the recorded
    runs, and its overhead joins the recipe's ``cell_overhead`` beside the earlier ones.
    ``earlier``: results of builds already in the record whose run gets its CPU seconds."""
    doc = json.loads(result.read_text())
    cell = Cell.from_id(doc["cell"])
    entries = read_entries(result.with_suffix(".ninja_log"))
    run = RecordedRun(source=f"{doc['name']} ({doc['cell']})", date=doc["date"],
                      max_jobs=doc["jobs"], cpus=doc["cpus"],
                      compile_seconds=doc["compile_seconds"],
                      peak_bytes=doc["compile_peak_rss_bytes"], peak_of="compilers",
                      machine=doc["machine"], order=tuple(o.key for o in entries),
                      cpu_seconds=_cpu(doc))
    history = MemoryHistory(json.loads(SHIPPED.read_text()), path=SHIPPED)
    history.fold(BuildMeasurement(
        cell=cell, nvcc_threads=doc["nvcc_threads"], max_jobs=doc["jobs"], peak_job_bytes=None,
        object_seconds=doc["object_seconds"], object_peaks=doc["object_peak_rss_bytes"],
        cpus=doc["cpus"], source=f"{doc['name']}: {result.with_suffix('.ninja_log').name}",
        run=run, object_stages=stages_of(entries)))
    shipped = history.as_document()
    for entry in shipped["objects"]:  # the date of the build, not of the fold
        if entry["package"] == cell.package and tuple(entry["archs"]) == cell.archs:
            entry["updated"] = doc["date"]
            entry["peak_source"] = ("the runners' sampler: each object's own largest RSS, the "
                                    "larger of its builds'")
            for other in map(lambda f: json.loads(f.read_text()), earlier):
                for r in entry.get("runs", []):
                    if (r["date"], r["compile_seconds"]) == (other["date"],
                                                           other["compile_seconds"]):
                        r["cpu_seconds"] = _cpu(other)
    over = shipped["defaults"]["flash-attn"].setdefault("cell_overhead", [])
    over.append({
        "seconds": doc["overhead_seconds"],
        "source": f"{doc['cell']}, {doc['date']}, {doc['runner']} runner, {doc['machine']}: "
                  f"build {doc['build_seconds']} s - compile {doc['compile_seconds']} s"})
    SHIPPED.write_text(json.dumps(shipped, indent=1) + "\n")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("cell")
    c.add_argument("--work", type=Path, required=True)
    c.add_argument("--dist", type=Path, required=True)
    c.add_argument("--cpu", type=Path, default=None)
    c.add_argument("--name", default="the flagship cell built on the 2-core builder")
    c.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("ship")
    s.add_argument("result", type=Path)
    s.add_argument("--runs", type=Path, default=None,
                   help="replay_real_runs.py --history-runs output: the other runs to keep")
    s.add_argument("--fold", action="store_true",
                   help="fold it in as a builder folds a build: the entry's earlier times "
                        "and runs stay, as its recorded runs")
    s.add_argument("--earlier", type=Path, nargs="*", default=[],
                   help="with --fold: results of builds already in the record, whose run "
                        "records get their container's CPU seconds")
    args = ap.parse_args(argv)
    if args.command == "collect":
        doc = collect(args.cell, args.work, args.dist, args.cpu, args.name, args.out)
        print(f"{args.out}: compile {doc['compile_seconds']} s, build {doc['build_seconds']} s, "
              f"{len(doc['object_peak_rss_bytes'])} object peaks")
    elif args.fold:
        fold(args.result, args.earlier)
        print(f"{SHIPPED}: {args.result.name} folded in")
    else:
        ship(args.result, args.runs)
        print(f"{SHIPPED}: {args.result.name} shipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
