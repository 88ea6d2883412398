"""Per-job memory and per-object compile times, learned from builds and kept in a history file.

Memory is keyed by (package, version, CUDA major.minor, archs compiled concurrently per job,
NVCC_THREADS). "Concurrently" is min(NVCC_THREADS, archs): nvcc --threads compiles that many
archs of one file at once, and each costs about a whole compiler's memory (measured,
docs/BENCHMARKS.md: ~4.5 GB per concurrently compiling arch). A key nobody measured falls back
to less specific keys, then to the recipe's per-arch default, and says which one it used.

Every figure is a PEAK: memory per job swings widely within a build and a plan sized on the
mean is OOM-killed at the first coincidence of heavy kernels. A record keeps the last few
observed peaks and answers with their maximum, so one bad measurement ages out but a
lighter build never talks the model below what it has recently seen.

Per-object times come with the runs they were measured in (``RecordedRun``: jobs, CPUs, the
compile's span and peak as a whole), so a plan can say how far its figures have been off on
the machines that made them (factory.planning.spread).

The file itself (where it is, its checks, atomic writes) is factory.planning.history_file;
writes here happen under an advisory lock, so builders sharing the file do not lose each
other's records. What a finished attempt adds is factory.planning.record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from factory.environment import HISTORY_ENV
from factory.errors import ConfigError
from factory.matrix.cell import Cell
from factory.planning.history_file import (
    atomic_write_json,
    checked,
    empty_document,
    history_path,
    read_document,
    shipped_history_path,
    today,
)
from factory.planning.object_times import ObjectTimes, RecordedRun, nearest_times
from factory.units import format_size

RECENT_PEAKS = 5  # peaks remembered per key; the estimate is their maximum
# An estimate borrowed from another version, CUDA or arch count gets this much on top:
# kernels and compilers change between releases, and an OOM costs more than one job less.
INFERRED_MARGIN = 0.10
RECENT_RUNS = 8  # whole runs remembered per objects entry (the spread a plan's range comes from)


@dataclasses.dataclass(frozen=True, kw_only=True, order=True)
class ModelKey:
    package: str
    version: str
    cuda: str  # "13.0"
    concurrent_archs: int  # min(NVCC_THREADS, archs)
    nvcc_threads: int

    @classmethod
    def for_cell(cls, cell: Cell, nvcc_threads: int) -> ModelKey:
        threads = max(1, nvcc_threads)
        return cls(
            package=cell.package, version=cell.version, cuda=cell.cuda,
            concurrent_archs=min(threads, len(cell.archs)), nvcc_threads=threads,
        )

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        return (
            f"{self.package} {self.version} CUDA {self.cuda}, {self.concurrent_archs} arch(s) "
            f"at once, {self.nvcc_threads} nvcc thread(s)"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Estimate:
    per_job_bytes: int  # a job's peak, taken over all objects (what many jobs average to)
    source: str  # a sentence: which record or default, and any margin added
    exact: bool  # measured for exactly this key
    # The heaviest single object, when one was measured above the per-job peak (flash-attn's
    # backward hdim256 kernels: 6.7 GiB against 4.2 GiB per job over a whole build); else
    # per_job_bytes. The planner counts it for the first jobs (planner.predicted_peak).
    largest_object_bytes: int = 0
    largest_object_source: str = ""
    # The least of the record's recent peaks, scaled as per_job_bytes (0: per_job_bytes) and
    # how many there are: the spread of the builds the estimate comes from.
    per_job_low_bytes: int = 0
    peaks_seen: int = 0

    @property
    def largest(self) -> int:
        return max(self.per_job_bytes, self.largest_object_bytes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildMeasurement:
    """What one finished (or OOM-killed) build attempt measured; see ``MemoryHistory.record``."""

    cell: Cell
    nvcc_threads: int
    max_jobs: int
    # The largest peak of one compile job's process tree (nvcc and its cicc/ptxas children),
    # or the compile's anonymous memory peak divided by the jobs that ran; None: not measured.
    peak_job_bytes: int | None
    object_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    object_peaks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    cpus: int = 0
    source: str = ""
    run: RecordedRun | None = None  # the attempt as a whole, when it compiled every object
    # object key -> the ninja run it compiled in, for those after the first (ObjectTimes.stages)
    object_stages: Mapping[str, int] = dataclasses.field(default_factory=dict)


def _key_of(rec: Mapping[str, Any]) -> ModelKey:
    return ModelKey(
        package=str(rec["package"]), version=str(rec["version"]), cuda=str(rec["cuda"]),
        concurrent_archs=int(rec["concurrent_archs"]), nvcc_threads=int(rec["nvcc_threads"]),
    )


class MemoryHistory:
    """The memory model and object times. Mutable: it is the store builds write back into."""

    def __init__(self, document: Mapping[str, Any], *, path: Path | None,
                 base: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self._doc = _checked(document, str(path) if path else "history")
        self._base = _checked(base, "shipped history") if base is not None else None

    # -- loading and saving -------------------------------------------------------------------
    @classmethod
    def load(cls, path: Path | str | None = None) -> MemoryHistory:
        target = history_path(path)
        shipped = shipped_history_path()
        base = None
        if target.resolve() != shipped.resolve():
            base = read_document(shipped)
        doc = read_document(target) if target.exists() else empty_document()
        return cls(doc, path=target, base=base)

    @classmethod
    def scratch(cls) -> MemoryHistory:
        """A history that remembers nothing (path None: save does nothing)."""
        return cls(empty_document(), path=None)

    def as_document(self) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(self._doc))  # a deep copy, JSON-clean
        return copy

    def save(self) -> None:
        if self.path is None:
            return
        try:
            atomic_write_json(self.path, self._doc)
        except OSError as exc:
            raise ConfigError(
                f"cannot write memory history {self.path}: {exc.strerror or exc}",
                tip=f"point ${HISTORY_ENV} at a writable file",
            ) from None

    # -- reading ------------------------------------------------------------------------------
    def _layers(self) -> list[Mapping[str, Any]]:
        return [self._doc] + ([self._base] if self._base is not None else [])

    def _records(self) -> dict[ModelKey, Mapping[str, Any]]:
        out: dict[ModelKey, Mapping[str, Any]] = {}
        for layer in reversed(self._layers()):  # the user's file overrides the shipped one
            for rec in layer.get("memory", []):
                key = _key_of(rec)
                below = out.get(key)
                heavier = below.get("largest_object_bytes", 0) if below else 0
                if below and heavier > rec.get("largest_object_bytes", 0):
                    # a measured heavy object stays known when a later layer re-measures the key
                    rec = {**rec, "largest_object_bytes": below["largest_object_bytes"],
                           "largest_object_source": below.get("largest_object_source", "")}
                out[key] = rec
        return out

    def default(self, model_key: str) -> tuple[str, Mapping[str, Any]] | None:
        """The recipe's defaults table (its name, the table), else "*"; None: neither."""
        for layer in self._layers():
            defaults = layer.get("defaults", {})
            for name in (model_key, "*"):
                if name and name in defaults:
                    return name, defaults[name]
        return None

    def headroom_bytes(self, model_key: str) -> int:
        found = self.default(model_key)
        if found and "headroom_bytes" in found[1]:
            return int(found[1]["headroom_bytes"])
        return 2 * 1024**3

    def non_compile_bytes(self, model_key: str) -> int:
        """Memory held beside the compiles (setup.py with torch imported, ninja), measured;
        the headroom where nobody measured it."""
        found = self.default(model_key)
        if found and "non_compile_bytes" in found[1]:
            return int(found[1]["non_compile_bytes"])
        return self.headroom_bytes(model_key)

    def estimate(self, key: ModelKey, *, model_key: str = "") -> Estimate:
        """Per-job peak for ``key``, from the most specific record that exists; the heaviest
        object from the same record, else from another record of the package and version
        (scaled per arch compiled at once: a heavy kernel stays heavy at any arch count)."""
        est = self._estimate(key, model_key=model_key)
        if est.largest_object_bytes:
            return est
        heavy = [(k, r) for k, r in self._records().items()
                 if (k.package, k.version) == (key.package, key.version)
                 and r.get("largest_object_bytes")]
        if not heavy:
            return est
        k, rec = max(heavy, key=lambda kr: int(kr[1]["largest_object_bytes"])
                     / kr[0].concurrent_archs)
        return dataclasses.replace(est, **_largest(rec, key.concurrent_archs / k.concurrent_archs))

    def _estimate(self, key: ModelKey, *, model_key: str = "") -> Estimate:
        records = self._records()
        if key in records:
            rec = records[key]
            return Estimate(per_job_bytes=_peak(rec), exact=True,
                            source=f"measured for {key.describe()} ({_provenance(rec)})",
                            **_largest(rec, 1.0), **_low(rec, 1.0))

        def best(match: Any) -> tuple[ModelKey, Mapping[str, Any]] | None:
            found = [(k, r) for k, r in records.items() if match(k)]
            if not found:
                return None
            return max(found, key=lambda kr: _peak(kr[1]) / kr[0].concurrent_archs)

        p, c = key.package, key.concurrent_archs
        levels: list[tuple[str, Any, float]] = [
            ("other nvcc threads", lambda k: (k.package, k.version, k.cuda, k.concurrent_archs)
             == (p, key.version, key.cuda, c), 0.0),
            ("CUDA {cuda}", lambda k: (k.package, k.version, k.concurrent_archs)
             == (p, key.version, c), INFERRED_MARGIN),
            ("version {version}", lambda k: (k.package, k.concurrent_archs) == (p, c),
             INFERRED_MARGIN),
            ("{archs} arch(s) at once, scaled per arch", lambda k: k.package == p,
             INFERRED_MARGIN),
        ]
        for label, match, margin in levels:
            hit = best(match)
            if hit is None:
                continue
            k, rec = hit
            per_job = _peak(rec) / k.concurrent_archs * c
            value = int(per_job * (1 + margin))
            what = label.format(cuda=k.cuda, version=k.version, archs=k.concurrent_archs)
            extra = f" + {margin:.0%} margin" if margin else ""
            return Estimate(per_job_bytes=value, exact=False,
                            source=f"inferred from {what}: {k.describe()} "
                            f"({_provenance(rec)}){extra}",
                            **_largest(rec, c / k.concurrent_archs * (1 + margin)),
                            **_low(rec, c / k.concurrent_archs * (1 + margin)))
        found = self.default(model_key or p)
        if found is None:
            raise ConfigError(f"the memory history has no default for {model_key or p!r} nor '*'")
        name, default = found
        per_arch = int(default["per_arch_bytes"])
        return Estimate(per_job_bytes=per_arch * c, exact=False,
                        source=f"default for recipe {name!r}: {format_size(per_arch)} per arch "
                        f"compiled at once ({default.get('source', 'no source given')})")

    def object_times(self, cell: Cell, cpus: int | None = None) -> ObjectTimes | None:
        """The best-matching per-object times for a cell: same archs and CUDA first. With
        ``cpus`` (the machine a plan is for), the times of the entry's recorded run nearest
        that many CPUs where one is nearer than the entry's own (``nearest_times``)."""
        candidates: list[tuple[tuple[int, ...], ObjectTimes]] = []
        for depth, layer in enumerate(self._layers()):
            for entry in layer.get("objects", []):
                if entry.get("package") != cell.package:
                    continue
                ot = ObjectTimes(
                    package=entry["package"], version=str(entry["version"]),
                    cuda=str(entry["cuda"]),
                    archs=tuple(int(a) for a in entry["archs"]),
                    nvcc_threads=int(entry.get("nvcc_threads", 1)),
                    seconds={str(k): float(v) for k, v in entry["seconds"].items()},
                    source=str(entry.get("source", "")),
                    peaks={str(k): int(v) for k, v in entry.get("peak_bytes", {}).items()},
                    max_jobs=int(entry.get("max_jobs", 0)), cpus=int(entry.get("cpus", 0)),
                    runs=_runs(entry), ooms=int(entry.get("ooms", 0)),
                    stages={str(k): int(v) for k, v in entry.get("stages", {}).items()},
                    peaks_from=", ".join(str(x) for x in (
                        entry.get("peak_source"), entry.get("source")) if x),
                )
                rank = (
                    ot.version != cell.version, ot.cuda != cell.cuda,
                    ot.archs != cell.archs, depth,
                )
                candidates.append((tuple(int(r) for r in rank), ot))
        if not candidates:
            return None
        found = min(candidates, key=lambda c: c[0])[1]
        return nearest_times(found, cpus) if cpus else found

    # -- writing ------------------------------------------------------------------------------
    def record(self, m: BuildMeasurement) -> None:
        """Fold one build's measurement in and save; re-reads the file under the lock first so
        concurrent builders sharing it keep each other's records."""
        with self._locked():
            self.fold(m)
            self.save()

    def fold(self, m: BuildMeasurement) -> None:
        """Fold a measurement into this history in memory (no save): how records shared
        through a store are merged into the view a plan reads."""
        key = ModelKey.for_cell(m.cell, m.nvcc_threads)
        if m.peak_job_bytes is not None and m.peak_job_bytes > 0:
            self._add_peak(key, int(m.peak_job_bytes), m.source, oom=False)
        if m.object_seconds or m.object_peaks:
            self._set_objects(m)

    def record_oom(self, key: ModelKey, per_job_floor_bytes: int, source: str,
                   peak_factor: float = 1.0) -> None:
        """An OOM kill proves a job needs more than ``per_job_floor_bytes``; remember that.
        The per-object peaks of the key's package, version and CUDA grow by ``peak_factor``
        too, so a plan replaying them is no bolder than the retry."""
        with self._locked():
            self._add_peak(key, int(per_job_floor_bytes), source, oom=True)
            if peak_factor > 1.0:
                self._scale_object_peaks(key, peak_factor)
            self.save()

    def _scale_object_peaks(self, key: ModelKey, factor: float) -> None:
        entries: list[dict[str, Any]] = self._doc.setdefault("objects", [])
        mine = {id(e) for e in entries}
        for layer in self._layers()[1:]:  # a shipped entry is copied in before it changes
            for e in layer.get("objects", []):
                if id(e) not in mine and not any(_same_objects(e, o) for o in entries):
                    entries.append(json.loads(json.dumps(e)))
        for e in entries:
            if (e["package"], str(e["version"]), str(e["cuda"])) == (
                    key.package, key.version, key.cuda) and e.get("peak_bytes"):
                e["peak_bytes"] = {k: int(v * factor) for k, v in e["peak_bytes"].items()}
                e["ooms"] = int(e.get("ooms", 0)) + 1  # no run may talk the peaks down again

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.path is None:
            yield
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create {self.path.parent}: {exc.strerror or exc}") from None
        # Lock the directory, not the file: os.replace swaps the file's inode, so a lock on
        # the file would not exclude a writer that opened the new one; and no lock file is
        # left lying in the package or on the share.
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self.path.exists():
                self._doc = _checked(read_document(self.path), str(self.path))
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _add_peak(self, key: ModelKey, peak: int, source: str, *, oom: bool) -> None:
        records: list[dict[str, Any]] = self._doc.setdefault("memory", [])
        rec = next((r for r in records if _key_of(r) == key), None)
        if rec is None:
            inherited = self._records().get(key)  # start from the shipped record, if any
            rec = {**key.as_dict(), "recent_peaks": list(inherited["recent_peaks"])
                   if inherited else [], "builds": int(inherited["builds"]) if inherited else 0,
                   "ooms": int(inherited.get("ooms", 0)) if inherited else 0}
            records.append(rec)
        rec["recent_peaks"] = (list(rec.get("recent_peaks", [])) + [peak])[-RECENT_PEAKS:]
        rec["peak_bytes"] = max(rec["recent_peaks"])
        if oom:
            rec["ooms"] = int(rec.get("ooms", 0)) + 1
        else:
            rec["builds"] = int(rec.get("builds", 0)) + 1
        rec["source"] = source or rec.get("source", "")
        rec["updated"] = today()
        records.sort(key=lambda r: _key_of(r))

    def _set_objects(self, m: BuildMeasurement) -> None:
        entries: list[dict[str, Any]] = self._doc.setdefault("objects", [])
        new = {"package": m.cell.package, "version": m.cell.version, "cuda": m.cell.cuda,
               "archs": list(m.cell.archs), "nvcc_threads": m.nvcc_threads}
        old = [e for e in entries if _same_objects(e, new)]
        entries[:] = [e for e in entries if not any(e is o for o in old)]
        # Peaks: the largest recently seen per object (a lighter build never talks a heavy
        # object down); an object this build did not sample keeps its old figure.
        peaks = {str(k): int(v) for o in old for k, v in o.get("peak_bytes", {}).items()}
        for k, v in m.object_peaks.items():
            peaks[k] = max(int(v), peaks.get(k, 0))
        seconds = ({k: round(float(v), 3) for k, v in sorted(m.object_seconds.items())}
                   if m.object_seconds else dict(old[-1]["seconds"]) if old else {})
        runs = [r for o in old for r in o.get("runs", [])]
        if m.object_seconds:  # the times are this build's now: the run that supplied the old
            # ones keeps them (a plan for a machine like it takes them: nearest_times)
            runs = [{**_unflagged(r), "seconds": r.get("seconds") or dict(old[-1]["seconds"])}
                    if r.get("supplied_times") and old else _unflagged(r) for r in runs]
        if m.run is not None:  # a run folded in again (shared records) keeps its place
            this = dataclasses.replace(m.run, supplied_times=bool(m.object_seconds)).as_dict()
            at = [i for i, r in enumerate(runs) if _unkept(r) == _unkept(this)]
            if at:
                runs[at[0]] = this
            else:
                runs.append(this)
        entry: dict[str, Any] = {
            **new, "max_jobs": m.max_jobs, "cpus": m.cpus, "source": m.source,
            "updated": today(), "seconds": seconds, "peak_bytes": dict(sorted(peaks.items())),
        }
        if m.object_stages:
            entry["stages"] = dict(sorted((k, int(v)) for k, v in m.object_stages.items()))
        if not m.object_seconds and old:  # the times (and their conditions) stay the old ones
            entry.update({k: old[-1][k] for k in ("max_jobs", "cpus", "source", "stages")
                          if k in old[-1]})
        if runs:
            entry["runs"] = runs[-RECENT_RUNS:]
        ooms = sum(int(o.get("ooms", 0)) for o in old)
        if ooms:
            entry["ooms"] = ooms
        entries.append(entry)


def _same_objects(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    def ident(e: Mapping[str, Any]) -> tuple[object, ...]:
        return (e["package"], str(e["version"]), str(e["cuda"]), list(e["archs"]),
                int(e.get("nvcc_threads", 1)))
    return ident(a) == ident(b)


def _unflagged(run: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k != "supplied_times"}


def _unkept(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run record without what changes as later builds come (the flag, its kept times)."""
    return {k: v for k, v in run.items() if k not in ("supplied_times", "seconds")}


def _runs(entry: Mapping[str, Any]) -> tuple[RecordedRun, ...]:
    """The entry's recorded runs; one that does not parse is left out (a plan's range is
    worth less than the plan)."""
    out = []
    for d in entry.get("runs", []):
        try:
            out.append(RecordedRun.from_dict(d))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out)


def _checked(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = checked(doc, where)
    try:
        for rec in out["memory"]:
            _key_of(rec)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: a memory record lacks or mangles {exc}") from None
    return out


def _largest(rec: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """The record's heaviest single object (``largest_object_bytes``), scaled like its peak."""
    if not rec.get("largest_object_bytes"):
        return {}
    return {
        "largest_object_bytes": int(int(rec["largest_object_bytes"]) * scale),
        "largest_object_source": str(rec.get("largest_object_source", "")),
    }


def _low(rec: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """The least of the record's recent peaks, scaled like its peak, and how many it has."""
    peaks = [int(p) for p in rec.get("recent_peaks", [])] or [_peak(rec)]
    return {"per_job_low_bytes": int(min(peaks) * scale), "peaks_seen": len(peaks)}


def _peak(rec: Mapping[str, Any]) -> int:
    peaks = [int(p) for p in rec.get("recent_peaks", [])]
    return max(peaks + [int(rec.get("peak_bytes", 0))])


def _provenance(rec: Mapping[str, Any]) -> str:
    builds, ooms = int(rec.get("builds", 0)), int(rec.get("ooms", 0))
    bits = [f"{format_size(_peak(rec))} peak"]
    if builds:
        bits.append(f"{builds} build(s)")
    if ooms:
        bits.append(f"{ooms} OOM(s)")
    if rec.get("source"):
        bits.append(str(rec["source"]))
    return "; ".join(bits)
