"""``<matrix>.lock``: the matrix's rules resolved against the indexes, cell by cell.

Every cell with what a build needs to be offline and reproducible: the exact torch, where it
is installed from and its wheel's sha256, the package version, its sdist and sha256, the CUDA
and the release torch's build pins; and every cell known not to build, with its reason (never
attempted). ``factory lock`` writes it, builds and the other commands read it while it matches
matrix.toml (``matrix`` records a digest of the matrix's rules, so a changed matrix.toml is
noticed).

The file changes only when a cell does: a refresh that finds nothing new leaves it as it was,
byte for byte (its ``locked`` time is that of the last change).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.tomlread import tomllib
from factory.upstream.facts import Origin

LOCK_VERSION = 1
HEADER = (
    "# Written by `factory lock` from matrix.toml's rules and what the indexes list; do not\n"
    "# edit. Refresh: `factory lock`; see what a refresh would change: `factory lock --check`.\n"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LockedCell:
    id: str
    package: str
    version: str
    sdist: str | None  # the sdist's filename (PyPI sources)
    sha256: str | None  # the sdist's sha256
    torch: str
    torch_index: str  # "pypi", or the per-CUDA index torch is installed from
    torch_wheel: str | None  # the torch wheel this cell's CPU and Python install
    torch_sha256: str | None
    cuda: str
    cuda_release: str | None  # the CUDA release torch's build pins, e.g. "13.0.3"
    archs: tuple[int, ...]
    python: str
    platform: str
    manylinux: str | None = None  # set by an [[include]]; else the package's or settings'

    def as_toml(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "package": self.package, "version": self.version,
            "sdist": self.sdist, "sha256": self.sha256, "torch": self.torch,
            "torch-index": self.torch_index, "torch-wheel": self.torch_wheel,
            "torch-sha256": self.torch_sha256, "cuda": self.cuda,
            "cuda-release": self.cuda_release, "archs": list(self.archs),
            "python": self.python, "platform": self.platform, "manylinux": self.manylinux,
        }
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_toml(cls, d: Mapping[str, Any]) -> LockedCell:
        return cls(
            id=str(d["id"]), package=str(d["package"]), version=str(d["version"]),
            sdist=d.get("sdist"), sha256=d.get("sha256"), torch=str(d["torch"]),
            torch_index=str(d["torch-index"]), torch_wheel=d.get("torch-wheel"),
            torch_sha256=d.get("torch-sha256"), cuda=str(d["cuda"]),
            cuda_release=d.get("cuda-release"), archs=tuple(int(a) for a in d["archs"]),
            python=str(d["python"]), platform=str(d["platform"]), manylinux=d.get("manylinux"),
        )


    @property
    def declared(self) -> bool:
        return rests_on_declared(self.torch_index, self.torch_wheel)


def rests_on_declared(torch_index: str | None, torch_wheel: str | None) -> bool:
    """Whether a cell's torch is a declared build: one on a per-CUDA index that no one could
    read (written down from release notes), so no index named its wheel. Until one does,
    that the wheel exists is unverified."""
    return torch_index not in (None, "pypi") and not torch_wheel


def declared_lines(builds: Iterable[tuple[str, str, str]]) -> list[str]:
    """What a summary says of the cells on declared torch builds, given (torch, CUDA, index)
    of each such cell: how many, on which builds."""
    per = Counter(builds)
    if not per:
        return []
    return [f"declared: {sum(per.values())} cell(s) rest on torch builds no index was read "
            "for (written down from release notes): unverified until 'factory lock' reads "
            "the index; a build of one fails if the index lacks its wheel"] + [
        f"    torch {torch} CUDA {cuda} on {index}: {n} cell(s)"
        for (torch, cuda, index), n in sorted(per.items())]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LockedSkip:
    package: str
    cell: str  # the cell id, or its values where a rule gave no CUDA ("...-cu(default)-...")
    reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class UsedFact:
    what: str  # "torch releases, Pythons and CPUs", "PyPI's CUDA of torch 2.14.1", ...
    origin: Origin

    def as_toml(self) -> dict[str, str]:
        d = {"what": self.what, "source": self.origin.source, "fetched": self.origin.fetched,
             "via": self.origin.via}
        return {**d, "note": self.origin.note} if self.origin.note else d

    @classmethod
    def from_toml(cls, d: Mapping[str, Any]) -> UsedFact:
        return cls(what=str(d["what"]), origin=Origin(
            source=str(d["source"]), fetched=str(d["fetched"]), via=str(d.get("via", "get")),
            note=str(d.get("note", ""))))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lock:
    matrix: str  # digest of the matrix's rules (everything but [settings])
    locked: str  # when the cells last changed (ISO 8601 UTC)
    facts: tuple[UsedFact, ...]  # where the cells' facts came from, when they last changed
    cells: tuple[LockedCell, ...]
    skips: tuple[LockedSkip, ...]

    def same_cells(self, other: Lock | None) -> bool:
        # in any order: the file keeps them sorted, a resolved matrix in its own order
        return (other is not None and self.matrix == other.matrix
                and sorted(self.cells, key=_cell_id) == sorted(other.cells, key=_cell_id)
                and sorted(self.skips, key=_skip_key) == sorted(other.skips, key=_skip_key))

    def cell(self, cell_id: str) -> LockedCell | None:
        for c in self.cells:
            if c.id == cell_id:
                return c
        return None


def _cell_id(c: LockedCell) -> str:
    return c.id


def _skip_key(s: LockedSkip) -> tuple[str, str, str]:
    return (s.cell, s.package, s.reason)


def lock_path(matrix_path: Path) -> Path:
    """matrix.toml -> matrix.lock (beside it)."""
    return matrix_path.with_suffix(".lock")


def matrix_digest(data: Mapping[str, Any]) -> str:
    """What the lock was resolved from: the matrix without its [settings] (paths, runner and
    memory change no cell)."""
    rules = {k: v for k, v in data.items() if k != "settings"}
    blob = json.dumps(rules, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# -- the file ---------------------------------------------------------------------------------

def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def _table(name: str, d: Mapping[str, Any]) -> list[str]:
    return [f"[[{name}]]", *(f"{k} = {_value(v)}" for k, v in d.items()), ""]


def dumps(lock: Lock) -> str:
    lines = [HEADER.rstrip("\n"), f"version = {LOCK_VERSION}", f"matrix = {_value(lock.matrix)}",
             f"locked = {_value(lock.locked)}", ""]
    lines.append("# Where the facts came from when the cells last changed.")
    for fact in lock.facts:
        lines += _table("fact", fact.as_toml())
    for c in sorted(lock.cells, key=lambda c: c.id):
        lines += _table("cell", c.as_toml())
    if lock.skips:
        lines.append("# Cells the rules give that cannot be built, and why: never attempted.")
    for s in sorted(lock.skips, key=lambda s: s.cell):
        lines += _table("skip", {"package": s.package, "cell": s.cell, "reason": s.reason})
    return "\n".join(lines).rstrip("\n") + "\n"


def loads(text: str, *, where: str) -> Lock:
    try:
        doc = tomllib.loads(text)
        if doc.get("version") != LOCK_VERSION:
            raise ValueError(f"lock version {doc.get('version')!r} (this factory reads "
                             f"{LOCK_VERSION})")
        return Lock(
            matrix=str(doc["matrix"]), locked=str(doc["locked"]),
            facts=tuple(UsedFact.from_toml(f) for f in doc.get("fact", [])),
            cells=tuple(LockedCell.from_toml(c) for c in doc.get("cell", [])),
            skips=tuple(LockedSkip(package=str(s["package"]), cell=str(s["cell"]),
                                   reason=str(s["reason"])) for s in doc.get("skip", [])),
        )
    except (tomllib.TOMLDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where} is not a readable lock: {exc}",
                          tip="write it again with 'factory lock'") from None


def read_lock(path: Path) -> Lock | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return loads(text, where=str(path))


def write_lock(lock: Lock, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(dumps(lock))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


# -- what a refresh changes ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class Change:
    kind: str  # a key of CHANGE_WORDS: "add", "drop", "change", "skip" (newly known not to
    # build), "unskip", "reason" (a skip's), "rules" (matrix.toml's), "fact" (where read)
    cell: str  # "-" for the rules and the facts
    detail: str


def _shown(v: Any) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, tuple):
        return "[" + ", ".join(str(x) for x in v) + "]"
    text = str(v)
    return text[:12] if len(text) == 64 and all(ch in "0123456789abcdef" for ch in text) \
        else text  # a sha256: its first 12 digits name it


def _cell_diffs(a: LockedCell, b: LockedCell) -> list[str]:
    """Every field of a cell that differs, by its name in the file: ``sdist (none) -> x``."""
    return [f"{f.name.replace('_', '-')} {_shown(getattr(a, f.name))} -> "
            f"{_shown(getattr(b, f.name))}"
            for f in dataclasses.fields(LockedCell)
            if getattr(a, f.name) != getattr(b, f.name)]


def _fact_changes(old: Lock, new: Lock) -> list[Change]:
    """The facts a refresh would write, against the lock's: new, gone, or read elsewhere (the
    time a fact was read alone is no change)."""
    def key(f: UsedFact) -> tuple[str, str, str]:
        return (f.origin.source, f.origin.via, f.origin.note)

    def where(f: UsedFact) -> str:
        return f"{f.origin.source} ({f.origin.via})"

    before = {f.what: f for f in old.facts}
    after = {f.what: f for f in new.facts}
    out = [Change(kind="fact", cell="-", detail=f"new: {w}, from {where(after[w])}")
           for w in sorted(after.keys() - before.keys())]
    out += [Change(kind="fact", cell="-", detail=f"gone: {w}")
            for w in sorted(before.keys() - after.keys())]
    out += [Change(kind="fact", cell="-", detail=f"{w}: {where(before[w])} -> {where(after[w])}")
            for w in sorted(before.keys() & after.keys()) if key(before[w]) != key(after[w])]
    return out


def changes(old: Lock | None, new: Lock) -> list[Change]:
    """Everything a refresh changes in the lock, named: the matrix's rules, every field of
    every cell, the cells known not to build and their reasons, and the facts they rest on."""
    out = []
    if old is not None and old.matrix != new.matrix:
        out.append(Change(kind="rules", cell="-", detail=f"matrix.toml's rules changed (digest "
                          f"{old.matrix} -> {new.matrix})"))
    before = {c.id: c for c in (old.cells if old else ())}
    after = {c.id: c for c in new.cells}
    for cid in sorted(after.keys() - before.keys()):
        c = after[cid]
        out.append(Change(kind="add", cell=cid, detail=f"torch {c.torch} ({c.torch_index}), "
                          f"CUDA {c.cuda}" + (f", sdist sha256 {c.sha256[:12]}" if c.sha256
                                              else "")))
    for cid in sorted(before.keys() - after.keys()):
        out.append(Change(kind="drop", cell=cid, detail="no longer given by the rules"))
    for cid in sorted(before.keys() & after.keys()):
        if diffs := _cell_diffs(before[cid], after[cid]):
            out.append(Change(kind="change", cell=cid, detail="; ".join(diffs)))
    old_skips = {s.cell: s for s in (old.skips if old else ())}
    new_skips = {s.cell: s for s in new.skips}
    for cell in sorted(new_skips.keys() - old_skips.keys()):
        out.append(Change(kind="skip", cell=cell, detail=new_skips[cell].reason))
    for cell in sorted(old_skips.keys() - new_skips.keys()):
        out.append(Change(kind="unskip", cell=cell, detail="no longer a cell known not to build"))
    for cell in sorted(old_skips.keys() & new_skips.keys()):
        a, b = old_skips[cell], new_skips[cell]
        diffs = [f"{name} {x!r} -> {y!r}" for name, x, y in
                 (("package", a.package, b.package), ("reason", a.reason, b.reason)) if x != y]
        if diffs:
            out.append(Change(kind="reason", cell=cell, detail="; ".join(diffs)))
    return out + (_fact_changes(old, new) if old is not None else [])


# What each kind of change is called in a summary ("2 added, 1 changed").
CHANGE_WORDS = {"rules": "rules changed", "add": "added", "drop": "dropped", "change": "changed",
                "skip": "newly known not to build", "unskip": "no longer known not to build",
                "reason": "with a new reason not to build",
                "fact": "fact(s) new, gone or read elsewhere"}


def change_summary(found: Iterable[Change]) -> str:
    rows = list(found)
    return ", ".join(word if kind == "rules" else f"{n} {word}"
                     for kind, word in CHANGE_WORDS.items()
                     if (n := sum(c.kind == kind for c in rows)))


def change_table(found: Iterable[Change]) -> list[str]:
    rows = list(found)
    if not rows:
        return []
    width = max(len(r.cell) for r in rows)
    return [f"{'change':7} {'cell':{width}} detail"] + [
        f"{r.kind:7} {r.cell:{width}} {r.detail}" for r in rows]
