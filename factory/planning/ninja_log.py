"""What a build's ``.ninja_log`` says: each object's start and end, under a name stable across
build trees. The memory model's object times, the recorded runs' compile spans and the
accuracy benchmarks all read logs through here."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from factory.errors import ConfigError


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


class ObjectNames:
    """The build's objects by their file name, for an output that names its object only by the
    source's name: sccache runs nvcc's stages with their -o in a temp dir of the compile
    (``/tmp/sccache_nvccXXXX/<name>.ptx``, ``.cubin``). Such an output belongs to the one object
    of that name, and to none where two objects share it."""

    def __init__(self, objects: Iterable[str] = ()) -> None:
        self._by_name: dict[str, set[str]] = {}
        self.add(objects)

    def add(self, objects: Iterable[str]) -> None:
        for key in objects:
            self._by_name.setdefault(key.rsplit("/", 1)[-1], set()).add(key)

    def of(self, path: str) -> str | None:
        """The object key of the one object named like ``path``'s file (up to its first dot)."""
        named = self._by_name.get(path.rsplit("/", 1)[-1].split(".", 1)[0], set())
        return next(iter(named)) if len(named) == 1 else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoggedObject:
    key: str  # object_key of the output; ``<key>#<n>`` for its n-th compile in one build
    start: float  # seconds since ninja started
    end: float
    stage: int = 0  # the ninja run it compiled in (setup.py runs ninja once per extension)

    @property
    def seconds(self) -> float:
        return self.end - self.start


def repeat_key(key: str, n: int) -> str:
    """The key of an output's ``n``-th compile in one build (1: the key itself)."""
    return key if n <= 1 else f"{key}#{n}"


def base_key(key: str) -> str:
    """The output a (repeat) key names: 'csrc/scatter#2' -> 'csrc/scatter'."""
    return key.split("#", 1)[0]


def _lines(path: Path) -> list[tuple[float, float, str]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read ninja log {path}: {exc}") from None
    out = []
    for line in lines:
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 4:
            continue
        try:
            start, end = int(fields[0]), int(fields[1])
        except ValueError:
            continue
        out.append((start / 1000.0, end / 1000.0, object_key(fields[3])))
    return out


def read_entries(path: Path, *, compiled: int | None = None) -> list[LoggedObject]:
    """Every compile of a .ninja_log (v5-v7) in start order, its ninja runs end to end.

    setup.py runs ninja once per extension into one build dir and one log (torch-scatter: 8
    runs, 7 of its 10 sources compiled twice, for the CPU and the CUDA extension), each run
    counting from its own start. A run begins where an entry ends before the one logged
    before it (ninja logs an entry as it ends) or names an output the run already built; it
    is placed where the run before it ended (setup.py's seconds between runs are not in the
    log) and numbered in ``stage``. An output compiled again in a later run is another
    compile of the build: ``<key>#<n>`` (repeat_key).

    ``compiled``: how many objects the last attempt compiled (ninja's ``[N/M]`` counts): the
    log's last ``compiled`` entries are that attempt's; before them, an earlier attempt's
    (the log after an OOM resume), where the last compile of an output wins and one the last
    attempt compiled again is dropped. None: the whole log is one build's."""
    lines = _lines(path)
    split = len(lines) - compiled if compiled is not None and 0 <= compiled <= len(lines) else 0
    earlier, ours = lines[:split], lines[split:]
    runs: list[list[LoggedObject]] = []
    seen: dict[str, int] = {}
    offset = last_end = 0.0
    for start, end, key in ours:
        if not runs or end < last_end or any(base_key(o.key) == key for o in runs[-1]):
            offset = max((o.end for o in runs[-1]), default=0.0) if runs else 0.0
            runs.append([])
        last_end = end
        seen[key] = seen.get(key, 0) + 1
        runs[-1].append(LoggedObject(key=repeat_key(key, seen[key]), start=offset + start,
                                     end=offset + end, stage=len(runs) - 1))
    out = [o for run in runs for o in run]
    kept: dict[str, LoggedObject] = {}
    for start, end, key in earlier:
        if key not in seen:
            kept[key] = LoggedObject(key=key, start=start, end=end)
    return sorted([*kept.values(), *out], key=lambda o: (o.start, o.key))


def read_ninja_log(path: Path) -> dict[str, float]:
    """Object key -> seconds from a .ninja_log (``read_entries``: a repeat as its own key)."""
    return {o.key: o.seconds for o in read_entries(path)}


def stages_of(entries: Iterable[LoggedObject]) -> dict[str, int]:
    """Object key -> the ninja run it compiled in, for those after the first run."""
    return {o.key: o.stage for o in entries if o.stage}


def compile_span(entries: list[LoggedObject]) -> float:
    """The compile's wall time: the first start to the last end (0 for no objects)."""
    if not entries:
        return 0.0
    return max(o.end for o in entries) - min(o.start for o in entries)


def read_ninja_timeline(path: Path) -> list[LoggedObject]:
    """``read_entries`` with its times counted from the log's first start (the progress's ETA
    replay and the build report's timeline)."""
    entries = read_entries(path)
    t0 = min((o.start for o in entries), default=0.0)
    return [dataclasses.replace(o, start=o.start - t0, end=o.end - t0) for o in entries]


class NinjaCount:
    """ninja's ``[N/M]`` lines as they come: objects built and in all. setup.py runs ninja once
    per extension (torch-scatter: 8 runs), each counting its own objects from 1, so a count
    that does not go up starts a new run and the runs add up."""

    def __init__(self) -> None:
        self._built_before = self._total_before = 0
        self._run = (0, 0)  # the current run's [N/M]

    def feed(self, n: int, m: int) -> None:
        if n <= self._run[0]:
            self._built_before += self._run[0]
            self._total_before += self._run[1]
            self._run = (0, 0)
        self._run = (n, max(m, self._run[1]))

    @property
    def built(self) -> int:
        return self._built_before + self._run[0]

    @property
    def total(self) -> int:
        return self._total_before + self._run[1]


def ninja_counts(lines: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """Objects built and in all, from ninja's ``[N/M]`` lines in order (NinjaCount)."""
    count = NinjaCount()
    for n, m in lines:
        count.feed(n, m)
    return count.built, count.total
