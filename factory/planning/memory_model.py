"""Per-job memory and per-object compile times, learned from builds and kept in a history file.

Memory is keyed by (package, version, CUDA major.minor, archs compiled concurrently per job,
NVCC_THREADS). "Concurrently" is min(NVCC_THREADS, archs): nvcc --threads compiles that many
archs of one file at once, and each costs about a whole compiler's memory (measured,
docs/BENCHMARKS.md: ~4.5 GB per concurrently compiling arch). A key nobody measured falls back to
less specific keys, then to the recipe's per-arch default, and says which one it used.

Every figure is a PEAK: memory per job swings widely within a build and a plan sized on the
mean is OOM-killed at the first coincidence of heavy kernels. A record keeps the last few
observed peaks and answers with their maximum, so one bad measurement ages out but a
lighter build never talks the model below what it has recently seen.

The history is one JSON document, ``"version": 1``. The project ships defaults
(``factory/data/memory_history.json``); ``FACTORY_MEMORY_HISTORY`` or a path argument points
at another file (e.g. on a share, for several builders), which overlays the shipped one.
Writes are atomic (temp file + os.replace) under an advisory lock, so builders sharing the
file do not lose each other's records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import importlib.resources
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from factory.environment import HISTORY_ENV
from factory.errors import ConfigError, FactoryError
from factory.matrix.cell import Cell
from factory.matrix.load import PlannedCell
from factory.planning.replay import contention_factor
from factory.units import format_size

HISTORY_VERSION = 1
RECENT_PEAKS = 5  # peaks remembered per key; the estimate is their maximum
# An estimate borrowed from another version, CUDA or arch count gets this much on top:
# kernels and compilers change between releases, and an OOM costs more than one job less.
INFERRED_MARGIN = 0.10


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
    # per_job_bytes. The planner counts it for the first jobs
    # (factory.planning.planner.predicted_peak).
    largest_object_bytes: int = 0
    largest_object_source: str = ""

    @property
    def largest(self) -> int:
        return max(self.per_job_bytes, self.largest_object_bytes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ObjectTimes:
    """Per-object compile seconds from one build, and the conditions they were measured in."""

    package: str
    version: str
    cuda: str
    archs: tuple[int, ...]
    nvcc_threads: int
    seconds: Mapping[str, float]  # object key (see object_key) -> seconds
    source: str
    # object key -> its peak RSS (nvcc and its children), measured at ``nvcc_threads``
    peaks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # the conditions the seconds were measured under (their contention, see replay.py);
    # 0: unknown, taken as uncontended
    max_jobs: int = 0
    cpus: int = 0

    def per_arch_rounds(self) -> int:
        """How many sequential arch rounds each measured compile ran."""
        return math.ceil(len(self.archs) / min(self.nvcc_threads, len(self.archs)))

    def scaled(self, archs: int, nvcc_threads: int) -> dict[str, float]:
        """Seconds per object for a build of ``archs`` archs at ``nvcc_threads`` threads.

        The device compile (cicc + ptxas) dominates and runs once per arch, min(threads,
        archs) at a time, so a file's time scales with the number of rounds.
        """
        rounds = math.ceil(archs / min(max(1, nvcc_threads), archs))
        factor = rounds / self.per_arch_rounds()
        return {k: v * factor for k, v in self.seconds.items()}

    def alone(self) -> dict[str, float]:
        """Seconds per object with nothing else compiling (the measured contention removed)."""
        if not self.max_jobs or not self.cpus:
            return dict(self.seconds)
        conc = min(self.nvcc_threads, len(self.archs))
        factor = contention_factor(self.max_jobs * conc, self.cpus)
        return {k: v / factor for k, v in self.seconds.items()}

    def scaled_peaks(self, concurrent_archs: int) -> dict[str, int]:
        """Peak bytes per object at ``concurrent_archs`` archs compiled at once (each arch a
        compiler of about the same size, as in the per-job model)."""
        measured = min(self.nvcc_threads, len(self.archs))
        return {k: int(v * concurrent_archs / measured) for k, v in self.peaks.items()}


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


def object_key(path: str) -> str:
    """A build output or source path -> a name stable across build trees.

    '/src/x/build/temp.linux-x86_64-cpython-311/csrc/a/b.o' -> 'csrc/a/b'; 'csrc/a/b.cu' ->
    'csrc/a/b'. setuptools puts objects under build/temp.<platform>/ mirroring the sources.
    """
    parts = path.replace("\\", "/").replace("$ ", " ").split("/")
    for i, part in enumerate(parts):
        if part.startswith("temp."):
            parts = parts[i + 1 :]
            break
    name = "/".join(p for p in parts if p not in ("", "."))
    for suffix in (".cuda.o", ".o", ".obj", ".cu", ".cpp", ".cc", ".cxx", ".c"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


@dataclasses.dataclass(frozen=True)
class LoggedObject:
    """One object of a .ninja_log: seconds since the log's first start."""

    key: str  # object_key
    start: float
    end: float


def read_ninja_timeline(path: Path) -> list[LoggedObject]:
    """A .ninja_log (v5-v7) as a timeline in start order; the last entry of an output wins."""
    entries: dict[str, tuple[int, int]] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read ninja log {path}: {exc}") from None
    for line in lines:
        fields = line.split("\t")
        if line.startswith("#") or len(fields) < 4:
            continue
        try:
            entries[object_key(fields[3])] = (int(fields[0]), int(fields[1]))
        except ValueError:
            continue
    t0 = min((start for start, _ in entries.values()), default=0)
    return sorted((LoggedObject(k, (s - t0) / 1000.0, (e - t0) / 1000.0)
                   for k, (s, e) in entries.items()), key=lambda o: (o.start, o.key))


def read_ninja_log(path: Path) -> dict[str, float]:
    """Object key -> seconds from a .ninja_log (v5-v7; the last entry of an output wins)."""
    return {o.key: o.end - o.start for o in read_ninja_timeline(path)}


def shipped_history_path() -> Path:
    return Path(str(importlib.resources.files("factory.data").joinpath("memory_history.json")))


def history_path(path: Path | str | None = None) -> Path:
    """Explicit path, else $FACTORY_MEMORY_HISTORY, else the shipped defaults."""
    if path:
        return Path(path)
    env = os.environ.get(HISTORY_ENV)
    return Path(env) if env else shipped_history_path()


def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


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
            base = _read_document(shipped)
        doc = _read_document(target) if target.exists() else _empty_document()
        return cls(doc, path=target, base=base)

    @classmethod
    def scratch(cls) -> MemoryHistory:
        """A history that remembers nothing (path None: save does nothing)."""
        return cls(_empty_document(), path=None)

    def as_document(self) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(self._doc))  # a deep copy, JSON-clean
        return copy

    def save(self) -> None:
        if self.path is None:
            return
        try:
            _atomic_write_json(self.path, self._doc)
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
                largest = rec.get("largest_object_bytes", 0)
                if below and below.get("largest_object_bytes", 0) > largest:
                    # a measured heavy object stays known when a later layer re-measures the key
                    rec = {**rec, "largest_object_bytes": below["largest_object_bytes"],
                           "largest_object_source": below.get("largest_object_source", "")}
                out[key] = rec
        return out

    def _default(self, model_key: str) -> tuple[str, Mapping[str, Any]] | None:
        for layer in self._layers():
            defaults = layer.get("defaults", {})
            for name in (model_key, "*"):
                if name and name in defaults:
                    return name, defaults[name]
        return None

    def headroom_bytes(self, model_key: str) -> int:
        found = self._default(model_key)
        if found and "headroom_bytes" in found[1]:
            return int(found[1]["headroom_bytes"])
        return 2 * 1024**3

    def non_compile_bytes(self, model_key: str) -> int:
        """Memory held beside the compiles (setup.py with torch imported, ninja), measured;
        the headroom where nobody measured it."""
        found = self._default(model_key)
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
        k, rec = max(heavy,
                     key=lambda kr: int(kr[1]["largest_object_bytes"]) / kr[0].concurrent_archs)
        return dataclasses.replace(est, **_largest(rec, key.concurrent_archs / k.concurrent_archs))

    def _estimate(self, key: ModelKey, *, model_key: str = "") -> Estimate:
        records = self._records()
        if key in records:
            rec = records[key]
            return Estimate(per_job_bytes=_peak(rec), exact=True,
                            source=f"measured for {key.describe()} ({_provenance(rec)})",
                            **_largest(rec, 1.0))

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
                            **_largest(rec, c / k.concurrent_archs * (1 + margin)))
        found = self._default(model_key or p)
        if found is None:
            raise ConfigError(f"the memory history has no default for {model_key or p!r} nor '*'")
        name, default = found
        per_arch = int(default["per_arch_bytes"])
        return Estimate(per_job_bytes=per_arch * c, exact=False,
                        source=f"default for recipe {name!r}: {format_size(per_arch)} per arch "
                        f"compiled at once ({default.get('source', 'no source given')})")

    def object_times(self, cell: Cell) -> ObjectTimes | None:
        """The best-matching per-object times for a cell: same archs and CUDA first."""
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
                )
                rank = (
                    ot.version != cell.version, ot.cuda != cell.cuda,
                    ot.archs != cell.archs, depth,
                )
                candidates.append((tuple(int(r) for r in rank), ot))
        if not candidates:
            return None
        return min(candidates, key=lambda c: c[0])[1]

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
                self._doc = _checked(_read_document(self.path), str(self.path))
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
        rec["updated"] = _today()
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
        entries.append({
            **new, "max_jobs": m.max_jobs, "cpus": m.cpus, "source": m.source, "updated": _today(),
            "seconds": seconds,
            "peak_bytes": dict(sorted(peaks.items())),
        })


def _same_objects(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    def ident(e: Mapping[str, Any]) -> tuple[object, ...]:
        return (e["package"], str(e["version"]), str(e["cuda"]), list(e["archs"]),
                int(e.get("nvcc_threads", 1)))
    return ident(a) == ident(b)


def _largest(rec: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """The record's heaviest single object (``largest_object_bytes``), scaled like its peak."""
    if not rec.get("largest_object_bytes"):
        return {}
    return {
        "largest_object_bytes": int(int(rec["largest_object_bytes"]) * scale),
        "largest_object_source": str(rec.get("largest_object_source", "")),
    }


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


def _empty_document() -> dict[str, Any]:
    return {"version": HISTORY_VERSION, "defaults": {}, "memory": [], "objects": []}


def _read_document(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read memory history {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"memory history {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"memory history {path} must be a JSON object")
    return data


def _checked(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    if doc.get("version") != HISTORY_VERSION:
        raise ConfigError(
            f"{where}: memory history version {doc.get('version')!r} is not supported (only 1)"
        )
    out = dict(doc)
    for field in ("memory", "objects"):
        if not isinstance(out.setdefault(field, []), list):
            raise ConfigError(f"{where}: {field!r} must be a list")
    if not isinstance(out.setdefault("defaults", {}), dict):
        raise ConfigError(f"{where}: 'defaults' must be an object")
    try:
        for rec in out["memory"]:
            _key_of(rec)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: a memory record lacks or mangles {exc}") from None
    return out


def _atomic_write_json(path: Path, doc: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class CompileMeasurements(Protocol):
    """What record_build reads from a runner's result (factory.runners.base.RunResult)."""

    @property
    def oom_killed(self) -> bool: ...
    @property
    def compile_peak_rss_bytes(self) -> int | None:
        """Peak of the summed RSS of all compiler processes."""
    @property
    def max_concurrent_compiles(self) -> int | None:
        """Most compile jobs alive at one sample."""
    @property
    def cache_hits(self) -> int | None: ...
    @property
    def sccache_hits(self) -> int | None: ...
    @property
    def objects_built(self) -> int | None:
        """Objects compiled in this attempt (ninja's [N/M] lines)."""
    @property
    def object_peak_rss_bytes(self) -> Mapping[str, int] | None:
        """Output path -> its job's peak RSS."""
    @property
    def log_path(self) -> Path: ...


class PlanShape(Protocol):
    @property
    def max_jobs(self) -> int: ...
    @property
    def nvcc_threads(self) -> int: ...
    @property
    def cpus(self) -> int: ...


def record_build(pc: PlannedCell, plan: PlanShape, result: CompileMeasurements, *,
                 build_tree: Path | None = None, history: MemoryHistory | None = None,
                 share: Callable[[BuildMeasurement], None] | None = None) -> str:
    """Fold one finished attempt into the history; returns a line for the build log.

    Per-job peak: the compilers' peak summed RSS over the most jobs seen at once (a peak of
    the sum, like the shipped 16-job figure). Object times: the build tree's .ninja_log, which
    after an OOM resume holds every attempt's objects; skipped when a compile cache answered
    (hits are not compile times). An OOM-killed attempt is recorded by plan_after_oom instead.
    A history that cannot be written is reported, never fatal: the wheel matters more.
    """
    if result.oom_killed:
        return "memory history: OOM attempt (recorded by the re-plan)"
    peak = result.compile_peak_rss_bytes
    jobs = result.max_concurrent_compiles
    per_job = peak // jobs if peak and jobs else None
    if not result.objects_built:
        # a resumed build with every object already there only links: its small peak says
        # nothing about a compile job, and would drag the model down
        per_job = None
    # build.py keeps the tree in <work>/src and logs in <work>/logs/attempt-N.log.
    tree = build_tree if build_tree is not None else result.log_path.parent.parent / "src"
    seconds: dict[str, float] = {}
    if not result.cache_hits and not result.sccache_hits:  # any hit: not compile times
        for log in sorted(tree.glob("build/temp*/.ninja_log")):
            seconds.update(read_ninja_log(log))
    # A cache hit's process is small: only a compile's peak says what the object needs.
    peaks = {} if result.cache_hits or result.sccache_hits else {
        object_key(path): int(v) for path, v in (result.object_peak_rss_bytes or {}).items()}
    if per_job is None and not seconds and not peaks:
        return "memory history: nothing measured"
    history = history if history is not None else MemoryHistory.load()
    measurement = BuildMeasurement(
        cell=pc.cell, nvcc_threads=plan.nvcc_threads, max_jobs=plan.max_jobs,
        peak_job_bytes=per_job, object_seconds=seconds, object_peaks=peaks, cpus=plan.cpus,
        source=f"factory build {_today()}, {plan.max_jobs} job(s) x {plan.nvcc_threads} "
        "thread(s): peak compiler RSS / most jobs at once",
    )
    try:
        history.record(measurement)
        if share is not None:
            share(measurement)  # other builders merge it (factory.planning.shared_history)
    except FactoryError as exc:
        return f"memory history: not recorded ({exc.message})"
    got = f"{format_size(per_job)} per job" if per_job else "no memory figure"
    return (f"memory history {history.path}: {got}, {len(seconds)} object time(s), "
            f"{len(peaks)} object peak(s)")
