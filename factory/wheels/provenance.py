"""The provenance manifest: ``<wheel>.provenance.json``, written by the build next to each wheel
and published into the store beside it.

It answers "where did this wheel come from" without the build machine: the cell, the recipe
revision, the toolchain, the memory plan and every attempt (an OOM retry is history worth
keeping), the build time and peak memory, the log location and who built it. ``content_key``
is what ``factory matrix --missing`` and ``factory request`` compare against.

Credentials never reach a manifest: the writer scrubs the values of secret-looking environment
variables wherever they appear, values stored under secret-looking keys, and passwords in URLs.
A manifest is public (it is served next to the wheel).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from factory.errors import WheelError
from factory.matrix.cell import sm_names
from factory.store.base import FILES
from factory.units import format_size

SCHEMA_VERSION = 1
SUFFIX = ".provenance.json"
REDACTED = "***"

# Environment variable names whose values are secrets, matched anywhere in the name:
# AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN, TWINE_PASSWORD, HTTP_AUTHORIZATION, SSH_KEY, ... Broad on
# purpose: a false match only hides a string that happens to equal that variable's value.
SECRET_NAME_RE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|AUTH|CREDENTIAL", re.IGNORECASE)
# Manifest keys whose values are redacted whatever they hold. Narrower than the above, because
# the manifest's own fields include hashes named like keys (content_key, model_key).
SECRET_FIELD_RE = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|^KEY$",
    re.IGNORECASE,
)
# Shorter values would scrub ordinary words ("1", "true") out of the manifest.
_MIN_SECRET_LEN = 6
_URL_USERINFO_RE = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/@:\s]*):(?P<pw>[^/@\s]+)@")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellRecord:
    id: str
    package: str
    version: str
    torch: str
    cuda: str
    archs: tuple[int, ...]
    python: str
    variant: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attempt:
    attempt: int
    max_jobs: int | None
    nvcc_threads: int | None
    exit_code: int | None
    oom_killed: bool
    wall_seconds: float | None
    compile_peak_rss_bytes: int | None
    objects_built: int | None
    # Anything else the runner reported (memory limit, objects total, the attempt's log):
    # kept verbatim so a newer build's fields survive a read and a rewrite.
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    _FIELDS = (
        "attempt", "max_jobs", "nvcc_threads", "exit_code", "oom_killed", "wall_seconds",
        "compile_peak_rss_bytes", "objects_built",
    )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Attempt:
        return cls(
            attempt=int(d.get("attempt") or 0), max_jobs=d.get("max_jobs"),
            nvcc_threads=d.get("nvcc_threads"), exit_code=d.get("exit_code"),
            oom_killed=bool(d.get("oom_killed")), wall_seconds=d.get("wall_seconds"),
            compile_peak_rss_bytes=d.get("compile_peak_rss_bytes"),
            objects_built=d.get("objects_built"),
            extra={k: v for k, v in d.items() if k not in cls._FIELDS},
        )

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self._FIELDS}, **dict(self.extra)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Manifest:
    wheel: str
    sha256: str
    cell: CellRecord
    content_key: str
    recipe: Mapping[str, Any]  # {name, revision}
    toolchain: Mapping[str, Any]
    plan: Mapping[str, Any]  # {max_jobs, nvcc_threads, memory_budget_bytes, ..., reasons}
    attempts: tuple[Attempt, ...]
    build_seconds: float
    peak_memory_bytes: int | None
    log: str | None  # a path on the builder or a URL
    builder: Mapping[str, Any]  # {hostname, runner, image}
    created: str  # ISO 8601, UTC
    cache: Mapping[str, Any]  # {hits, misses}
    # the glibc floor: promised, how it was kept (sysroot or not), and what the binaries
    # reached with the symbol versions that set it (factory.wheels.floor); {} before it existed
    floor: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "wheel": self.wheel,
            "sha256": self.sha256,
            "cell": {**dataclasses.asdict(self.cell), "archs": list(self.cell.archs)},
            "content_key": self.content_key,
            "recipe": dict(self.recipe),
            "toolchain": dict(self.toolchain),
            "plan": dict(self.plan),
            "attempts": [a.to_dict() for a in self.attempts],
            "build_seconds": self.build_seconds,
            "peak_memory_bytes": self.peak_memory_bytes,
            "log": self.log,
            "builder": dict(self.builder),
            "created": self.created,
            "cache": dict(self.cache),
            "floor": dict(self.floor),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "manifest") -> Manifest:
        version = d.get("version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise WheelError(f"{source}: provenance version {version!r} is not supported (only 1)")
        try:
            c = d["cell"]
            cell = CellRecord(
                id=str(c["id"]), package=str(c["package"]), version=str(c["version"]),
                torch=str(c["torch"]), cuda=str(c["cuda"]),
                archs=tuple(int(a) for a in c["archs"]), python=str(c["python"]),
                variant=str(c.get("variant") or ""),
            )
            return cls(
                wheel=str(d["wheel"]),
                sha256=str(d["sha256"]),
                cell=cell,
                content_key=str(d["content_key"]),
                recipe=dict(d.get("recipe") or {}),
                toolchain=dict(d.get("toolchain") or {}),
                plan=dict(d.get("plan") or {}),
                attempts=tuple(Attempt.from_dict(a) for a in d.get("attempts") or ()),
                build_seconds=float(d.get("build_seconds") or 0.0),
                peak_memory_bytes=_opt_int(d.get("peak_memory_bytes")),
                log=None if d.get("log") is None else str(d["log"]),
                builder=dict(d.get("builder") or {}),
                created=str(d.get("created") or ""),
                cache=dict(d.get("cache") or {}),
                floor=dict(d.get("floor") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WheelError(
                f"{source}: not a provenance manifest ({type(exc).__name__}: {exc})"
            ) from None


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def manifest_name(wheel_filename: str) -> str:
    return wheel_filename + SUFFIX


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1024 * 1024), b""):
            h.update(block)
    return h.hexdigest()


# -- scrubbing ---------------------------------------------------------------------------------
def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values of secret-looking variables, longest first so a secret containing another is
    replaced whole."""
    values = {v for k, v in env.items() if SECRET_NAME_RE.search(k) and len(v) >= _MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def scrub(value: Any, secrets: list[str], *, key: str | None = None) -> Any:
    """A copy of ``value`` with secrets replaced by ``***``."""
    if (key is not None and SECRET_FIELD_RE.search(key) and isinstance(value, (str, int, float))
            and not isinstance(value, bool)):
        return REDACTED
    if isinstance(value, Mapping):
        return {str(k): scrub(v, secrets, key=str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, str):
        out = _URL_USERINFO_RE.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", value)
        for s in secrets:
            out = out.replace(s, REDACTED)
        return out
    return value


# -- write / read ------------------------------------------------------------------------------
def write_manifest(
    path: Path, manifest: Manifest | Mapping[str, Any], *, env: Mapping[str, str] | None = None
) -> Path:
    """Validate, scrub and write atomically (temp file in the same directory + ``os.replace``),
    so a reader or a publisher never sees half a manifest."""
    path = Path(path)
    if isinstance(manifest, Manifest):
        data = manifest.to_dict()
    else:
        # A dict from the build: check it parses as a manifest before anything is written.
        data = {"version": SCHEMA_VERSION, **dict(manifest)}
        Manifest.from_dict(data, source=str(path))
    clean = scrub(data, secret_values(os.environ if env is None else env))
    text = json.dumps(clean, indent=2, sort_keys=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)  # mkstemp makes 0600; the manifest is meant to be served
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def parse_manifest(data: bytes | str, *, source: str = "manifest") -> Manifest:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise WheelError(f"{source}: provenance manifest is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise WheelError(f"{source}: provenance manifest is not a JSON object")
    return Manifest.from_dict(doc, source=source)


def read_manifest(path: Path) -> Manifest:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise WheelError(f"no provenance manifest at {path}") from None
    except OSError as exc:
        raise WheelError(f"cannot read {path}: {exc.strerror}") from None
    return parse_manifest(data, source=str(path))


# -- rendering ---------------------------------------------------------------------------------
def _bytes(n: Any) -> str:
    return "-" if n is None else format_size(n)


def _seconds(s: Any) -> str:
    if s is None:
        return "-"
    s = float(s)
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec} s" if m < 60 else f"{m // 60} h {m % 60} min"


def render_text(m: Manifest, *, yanked: str | None = None) -> str:
    """What ``factory show`` prints for one wheel: the fields a person asks about first."""
    mark = f"  [yanked: {yanked or 'no reason given'}]" if yanked is not None else ""
    lines = [f"{m.wheel}{mark}"]
    c = m.cell
    archs = sm_names(c.archs)
    lines.append(f"  cell        {c.id}")
    lines.append(f"              {c.package} {c.version}, torch {c.torch}, CUDA {c.cuda}, {archs}, "
                 f"Python {c.python} (variant {c.variant})")
    lines.append(f"  sha256      {m.sha256}")
    lines.append(f"  content key {m.content_key} (recipe {m.recipe.get('name', '?')} "
                 f"rev {m.recipe.get('revision', '?')})")
    tc = m.toolchain
    if tc:
        src = tc.get("nvcc_source", "?")
        torch_from = tc.get("torch_index") or "PyPI"
        lines.append(f"  toolchain   CUDA {tc.get('cuda', '?')} from {src}; "
                     f"{tc.get('torch_requirement', 'torch ?')} from {torch_from}")
    p = m.plan
    if p:
        lines.append(
            f"  plan        MAX_JOBS={p.get('max_jobs', '?')} "
            f"NVCC_THREADS={p.get('nvcc_threads', '?')}, "
            f"budget {_bytes(p.get('memory_budget_bytes'))}, predicted peak "
            f"{_bytes(p.get('predicted_peak_bytes'))} ({_bytes(p.get('per_job_bytes'))}/job from "
            f"{p.get('per_job_source', '?')})"
        )
        for reason in p.get("reasons") or ():
            lines.append(f"              - {reason}")
    for a in m.attempts:
        outcome = "OOM-killed" if a.oom_killed else f"exit {a.exit_code}"
        lines.append(
            f"  attempt {a.attempt}   MAX_JOBS={a.max_jobs} NVCC_THREADS={a.nvcc_threads}: "
            f"{outcome} after {_seconds(a.wall_seconds)}, "
            f"peak compile RSS {_bytes(a.compile_peak_rss_bytes)}, "
            f"{a.objects_built if a.objects_built is not None else '?'} object(s) built"
        )
    lines.append(f"  build       {_seconds(m.build_seconds)}, "
                 f"peak memory {_bytes(m.peak_memory_bytes)}")
    if m.floor:
        reached = m.floor.get("reached") or {}
        how = "the glibc 2.31 sysroot" if m.floor.get("sysroot") else "the builder's glibc"
        highest = reached.get("highest") or {}
        lines.append(f"  glibc floor promised {m.floor.get('promised') or 'auto'} ({how}); "
                     f"binaries need {reached.get('policy', '?')} (GLIBC "
                     f"{highest.get('GLIBC', '-')}, GLIBCXX {highest.get('GLIBCXX', '-')})")
    if m.cache and any(v is not None for v in m.cache.values()):
        lines.append(f"  cache       {m.cache.get('hits')} hit(s), "
                     f"{m.cache.get('misses')} miss(es)")
    b = m.builder
    lines.append(f"  builder     {b.get('hostname', '?')} ({b.get('runner', '?')} runner, "
                 f"image {b.get('image') or '-'})")
    lines.append(f"  log         {m.log or '-'}")
    lines.append(f"  created     {m.created or '-'}")
    return "\n".join(lines)


# -- manifests in a store ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class PublishedBuild:
    """One published wheel with its manifest, as the store holds them."""

    manifest: Manifest
    key: str  # the wheel's store key
    yanked: str | None  # the yank reason, None when not yanked
    # False: the wheel and manifest are there but not its index entry: a publisher stopped
    # before its commit ('factory index rebuild' completes it); not a build on the index yet
    committed: bool = True


def published_builds(store: Any, project: str | None = None) -> list[PublishedBuild]:
    """Every wheel in ``store`` (a ``factory.store.Store``) that has a manifest, oldest first.

    A manifest whose wheel is missing is skipped: a publisher uploads the manifest first, so it
    may exist alone for a moment (or forever, after a crash) and names no build."""
    prefix = f"{FILES}/{project}/" if project else f"{FILES}/"
    keys = {o.key for o in store.list(prefix)}
    manifest_keys = sorted(k for k in keys if k.endswith(SUFFIX) and k[: -len(SUFFIX)] in keys)
    entries = {e.key: e for e in store.wheels(project)}
    # StoreBase._read_many reads in parallel where a read is a network round trip (S3); one
    # manifest per wheel makes that the difference between a second and a minute.
    reader = getattr(store, "_read_many", None)
    blobs = reader(manifest_keys) if reader else [store.read(k) for k in manifest_keys]
    out = []
    for key, data in zip(manifest_keys, blobs, strict=True):
        if data is None:
            continue
        wheel_key = key[: -len(SUFFIX)]
        out.append(PublishedBuild(
            manifest=parse_manifest(data, source=f"{store.url}/{key}"),
            key=wheel_key,
            yanked=entries[wheel_key].yanked if wheel_key in entries else None,
            committed=wheel_key in entries,
        ))
    out.sort(key=lambda b: (b.manifest.created, b.manifest.wheel))
    return out
