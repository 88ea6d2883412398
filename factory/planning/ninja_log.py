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
    key: str  # object_key of the output
    start: float  # seconds since ninja started
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def read_entries(path: Path) -> list[LoggedObject]:
    """Every object of a .ninja_log (v5-v7) in start order; the last entry of an output wins
    (a resumed build appends the objects it compiled again)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read ninja log {path}: {exc}") from None
    out: dict[str, LoggedObject] = {}
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
        key = object_key(fields[3])
        out[key] = LoggedObject(key=key, start=start / 1000.0, end=end / 1000.0)
    return sorted(out.values(), key=lambda o: (o.start, o.key))


def read_ninja_log(path: Path) -> dict[str, float]:
    """Object key -> seconds from a .ninja_log (the last entry of an output wins)."""
    return {o.key: o.seconds for o in read_entries(path)}


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
