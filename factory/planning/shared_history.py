"""Memory and time history shared by builders through the store: merged, never overwritten.

Every finished build writes its measurement as a new object of its own,
``history/records/<UTC stamp>-<random>.json``, with an exclusive create (S3 ``IfNoneMatch``,
the local store's exclusive write). Nothing is ever rewritten, so concurrent builders cannot
lose each other's records; a reader lists them and folds them, oldest first, into its own
history (the shipped defaults and the builder's file), exactly as its own builds would have
(peaks: the largest recent ones; per-object peaks: the largest seen; times: the latest).

Records come from every builder that shares the store, so they are untrusted input: every field
is checked, nested ones too (``measurement_of``), and a record that is not one is skipped with
its key and what is wrong, never an exception that stops a build (a ``"run": 42`` used to be an
AttributeError in every publishing build sharing the store).
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime
import json
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from factory.errors import FactoryError, StoreError
from factory.matrix.cell import DEFAULT_PLATFORM, Cell
from factory.planning.memory_model import BuildMeasurement, MemoryHistory
from factory.planning.object_times import PEAK_OF, RecordedRun

RECORDS_PREFIX = "history/records/"
RECORD_VERSION = 1


class _Listed(Protocol):
    @property
    def key(self) -> str: ...


class RecordStore(Protocol):
    """The primitives of factory.store's Store the records need (no import: the store
    is a later stage)."""

    def put_new(self, key: str, data: bytes) -> bool: ...

    def list(self, prefix: str, *, sizes: bool = True) -> Iterator[_Listed]: ...

    def read_many(self, keys: builtins.list[str]) -> builtins.list[bytes | None]: ...


def record_document(m: BuildMeasurement) -> dict[str, Any]:
    return {
        "version": RECORD_VERSION, "cell": m.cell.as_dict(), "nvcc_threads": m.nvcc_threads,
        "max_jobs": m.max_jobs, "cpus": m.cpus, "peak_job_bytes": m.peak_job_bytes,
        "object_seconds": dict(m.object_seconds), "object_peaks": dict(m.object_peaks),
        "source": m.source, "run": m.run.as_dict() if m.run else None,
        "object_stages": dict(m.object_stages),
    }


def measurement_of(doc: object) -> BuildMeasurement:
    """A record read back, checked as untrusted input: every field's type and range, nested
    ones too. Anything else than a record this module writes (another JSON type, a field of
    the wrong type, a cell that does not parse, a number no build measures) is a StoreError
    naming what is wrong."""
    try:
        if not isinstance(doc, dict):
            raise TypeError(f"a JSON {type(doc).__name__}, not an object")
        version = doc.get("version")
        if not _is_int(version) or version != RECORD_VERSION:
            raise ValueError(f"unknown record version {_shown(version)}")
        peak = doc.get("peak_job_bytes")
        run = doc.get("run")
        return BuildMeasurement(
            cell=_cell(doc["cell"]),
            nvcc_threads=_count(doc["nvcc_threads"], "nvcc_threads", 1, 1024),
            max_jobs=_count(doc["max_jobs"], "max_jobs", 1, 65536),
            cpus=_count(doc.get("cpus", 0), "cpus", 0, 65536),
            peak_job_bytes=None if peak is None else _count(peak, "peak_job_bytes", 0, _MAX_BYTES),
            object_seconds={k: _seconds(v, "object seconds")
                            for k, v in _table(doc, "object_seconds")},
            object_peaks={k: _count(v, "an object peak", 0, _MAX_BYTES)
                          for k, v in _table(doc, "object_peaks")},
            source=_text(doc, "source", ""),
            run=None if run is None else _run(run),
            object_stages={k: _count(v, "an object's ninja run", 0, _MAX_OBJECTS)
                           for k, v in _table(doc, "object_stages")},
        )
    except (KeyError, TypeError, ValueError, FactoryError) as exc:
        what = exc.message if isinstance(exc, FactoryError) else str(exc)
        if isinstance(exc, KeyError):
            what = f"no {exc}"
        raise StoreError(f"corrupt history record: {what}") from None


_MAX_BYTES = 2**40  # 1 TiB: more than any compile job's peak
_MAX_SECONDS = 30 * 86400.0
_MAX_OBJECTS = 100_000  # objects in one build's order


def _cell(c: object) -> Cell:
    if not isinstance(c, dict):
        raise TypeError("'cell' is not an object")
    archs = c["archs"]
    if not isinstance(archs, list) or not all(_is_int(a) and 0 < a < 10_000 for a in archs):
        raise TypeError("'archs' is not a list of sm numbers")
    return Cell(package=_text(c, "package"), version=_text(c, "version"),
                torch=_text(c, "torch"), cuda=_text(c, "cuda"), archs=tuple(archs),
                python=_text(c, "python"), platform=_text(c, "platform", DEFAULT_PLATFORM))


def _run(r: object) -> RecordedRun:
    """The whole run a record carries (``RecordedRun.as_dict``), each field checked."""
    if not isinstance(r, dict):
        raise TypeError(f"'run' is a JSON {type(r).__name__}, not an object")
    order = r.get("order", [])
    if not isinstance(order, list) or len(order) > _MAX_OBJECTS or \
            not all(isinstance(k, str) for k in order):
        raise TypeError("the run's 'order' is not a list of object names")
    peak = r.get("peak_bytes")
    peak_of = _text(r, "peak_of", "compilers")
    if peak_of not in PEAK_OF:
        raise ValueError(f"the run's peak_of {_shown(peak_of)} is not one of {PEAK_OF}")
    return RecordedRun(
        source=_text(r, "source", ""), date=_text(r, "date", ""),
        max_jobs=_count(r["max_jobs"], "the run's max_jobs", 1, 65536),
        cpus=_count(r["cpus"], "the run's cpus", 0, 65536),
        compile_seconds=_seconds(r["compile_seconds"], "the run's compile seconds"),
        peak_bytes=None if peak is None else _count(peak, "the run's peak_bytes", 0, _MAX_BYTES),
        peak_of=peak_of, machine=_text(r, "machine", ""), order=tuple(order),
        cpu_seconds=(None if r.get("cpu_seconds") is None
                     else _seconds(r["cpu_seconds"], "the run's CPU seconds")),
    )


def _shown(value: object) -> str:
    """A value of a record in a one-line message: short, no control characters."""
    return _one_line(repr(value)[:40])


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text[:300])


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_REQUIRED = object()


def _text(doc: dict[str, Any], name: str, default: object = _REQUIRED) -> str:
    value = doc[name] if default is _REQUIRED else doc.get(name, default)
    if not isinstance(value, str):
        raise TypeError(f"{name!r} is not a string")
    return value


def _count(value: object, name: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} {_shown(value)} is not a whole number in {low}..{high}")
    return value


def _seconds(value: object, name: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
            not 0 <= value <= _MAX_SECONDS:  # NaN fails this too
        raise ValueError(f"{name} {_shown(value)} are not 0..{_MAX_SECONDS:.0f}")
    return float(value)


def _table(doc: dict[str, Any], name: str) -> list[tuple[str, object]]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise TypeError(f"{name!r} is not an object")
    return list(value.items())


def push(store: RecordStore, m: BuildMeasurement) -> str:
    """Write one measurement as a new record; returns its key."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    key = f"{RECORDS_PREFIX}{stamp}-{uuid.uuid4().hex[:12]}.json"
    data = json.dumps(record_document(m), sort_keys=True).encode()
    if not store.put_new(key, data):
        raise StoreError(f"history record {key} already exists")
    return key


@dataclasses.dataclass(frozen=True, kw_only=True)
class BadRecord:
    key: str
    problem: str


def read_records(store: RecordStore) -> tuple[list[BuildMeasurement], list[BadRecord]]:
    """Every record in the store, oldest first, and the ones that are not records (each with
    why): read from a shared store, they are untrusted input."""
    keys = sorted(o.key for o in store.list(RECORDS_PREFIX, sizes=False))
    good: list[BuildMeasurement] = []
    bad: list[BadRecord] = []
    for key, data in zip(keys, store.read_many(keys), strict=True):
        if data is None:
            continue  # removed since the listing
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError too), or nested
            bad.append(BadRecord(key=key, problem="corrupt history record: not JSON (or "
                                 "nested too deep)"))
            continue
        try:
            good.append(measurement_of(doc))
        except StoreError as exc:
            bad.append(BadRecord(key=key, problem=_one_line(exc.message)))
        except Exception as exc:  # noqa: BLE001 - a shape no check above foresaw: still skipped
            bad.append(BadRecord(key=key, problem=_one_line(
                f"corrupt history record: {type(exc).__name__}: {exc}")))
    return good, bad


def merge_into(history: MemoryHistory, store: RecordStore,
               skipped: list[BadRecord] | None = None) -> int:
    """Fold every record in the store into ``history`` (in memory), oldest first; returns
    how many. A corrupt record is skipped, never fatal: a plan matters more. ``skipped``
    collects them, each with its key and one line on what is wrong. Raises only StoreError,
    when the store cannot be listed or read."""
    good, bad = read_records(store)
    folded = 0
    for m in good:
        history.fold(m)
        folded += 1
    if skipped is not None:
        skipped.extend(bad)
    return folded
