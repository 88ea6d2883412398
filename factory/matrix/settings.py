"""matrix.toml's ``[settings]``, checked and resolved once into a frozen ``Settings``: paths are
absolute (relative ones count from the matrix file's directory), sizes are parsed, and every
wrong value fails here in one line (ConfigError), not as a crash in the middle of a build.

One precedence for every value: command line > environment (``FACTORY_*``, the table
``factory.environment.ENVIRONMENT``, which ``factory --help`` lists) > matrix.toml > default.
The environment's values are read here, into ``Settings``, so every command that reads a
setting sees them; the command line's are applied by the command on top."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from factory.environment import ENVIRONMENT, STORE_ENV, env_value
from factory.errors import CellError, ConfigError, FactoryError, StoreError, UsageError, WheelError
from factory.matrix.cell import parse_python
from factory.matrix.manylinux import floor_policy
from factory.runners import DEFAULT_RUNNER, RUNNERS
from factory.store import URL_FORMS, open_store, url_scheme
from factory.units import parse_size

DEFAULT_STORE = "index/store"

TOOLKIT_SOURCES = ("pypi", "image", "system")

SETTINGS_KEYS = {
    "store", "wheelhouse", "runner", "memory", "cpus", "base-image", "plat", "work-dir", "toolkit",
    "memory-history", "venv-dir",
    "images", "compile-cache", "manylinux", "sysroot",
}
COMPILE_CACHE_KEYS = {"dir", "size", "remote"}
DEFAULT_CACHE_SIZE = "20G"  # the compile cache's bound, as sccache reads it

DEFAULTS: dict[str, Any] = {
    "store": DEFAULT_STORE,
    "wheelhouse": ".cache/factory/wheelhouse",
    "work-dir": ".cache/factory/work",
    "venv-dir": ".cache/factory/venvs",  # build venvs, shared by cells with the same torch
    "runner": DEFAULT_RUNNER,
    "memory": "auto",
    "cpus": 0,  # 0: all the runner may use
    "base-image": "factory-base:bookworm",
    "plat": "auto",
    "toolkit": list(TOOLKIT_SOURCES),  # where nvcc comes from, in order of preference
    # builds record measured memory here (layered over the shipped defaults); share it between
    # builders by pointing this (or $FACTORY_MEMORY_HISTORY) at a common file
    "memory-history": ".cache/factory/memory_history.json",
    # The glibc floor of every wheel (a manylinux policy, like torch's own "2_28"), unless a
    # package or an [[include]] names another; "auto": whatever the builder's glibc gives.
    "manylinux": "2_28",
    # How a builder newer than the floor reaches it: "bullseye" (the factory's glibc 2.31
    # sysroot, factory.toolchain.sysroot) or "none".
    "sysroot": "bullseye",
}
SYSROOTS = ("bullseye", "none")

_TEXT_SETTINGS = (
    "store", "wheelhouse", "work-dir", "venv-dir", "runner", "base-image", "plat",
    "memory-history", "manylinux", "sysroot",
)


def check_keys(table: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """Every key of ``table`` is one of ``allowed``; else one line with a did-you-mean."""
    allowed = set(allowed)
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown key {key!r} in {where}{hint}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompileCacheSettings:
    """``[settings.compile-cache]``. ``remote`` stays a spec ("store" or ``s3://...``): the store
    it may name can still be replaced by ``--store``, so it is resolved where it is used."""

    dir: Path  # on the builder; every build container mounts it
    size: str  # the bound, as sccache reads it ("20G")
    remote: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    store: str  # a directory (absolute) or a URL store's spec (factory.store)
    wheelhouse: Path
    work_dir: Path
    venv_dir: Path
    memory_history: Path
    runner: str
    memory: int | None  # bytes; None: "auto" (the runner's limit)
    cpus: int | None  # None: all the runner may use
    base_image: str
    images: tuple[tuple[str, str], ...]  # (Python version, builder image), as written
    plat: str  # "auto" or a platform tag
    toolkit: tuple[str, ...]  # nvcc sources in order of preference
    compile_cache: CompileCacheSettings
    manylinux: str = "2_28"  # the default glibc floor ("2_28"), or "auto"
    sysroot: str = "bullseye"  # how a newer builder reaches it: "bullseye" or "none"

    @classmethod
    def from_table(
        cls, raw: Mapping[str, Any], *, root: Path, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """``raw`` is the ``[settings]`` table as TOML gives it; ``root`` is where relative paths
        start (the matrix file's directory). The environment's ``FACTORY_*`` values win over the
        table; a relative path there counts from the working directory, as a shell's would."""
        check_keys(raw, SETTINGS_KEYS, "[settings]")
        table = {**DEFAULTS, **raw}
        from_env: dict[str, Path] = {}
        for var in ENVIRONMENT:
            value = env_value(var.name, environ)
            if var.setting and value:
                table[var.setting] = value
                from_env[var.setting] = Path.cwd()
        for key in _TEXT_SETTINGS:
            if not isinstance(table.get(key), str) or not table[key]:
                raise ConfigError(f"[settings] {key} must be a non-empty string")
        runner = _runner(table["runner"])
        memory = _memory(table["memory"])
        cpus = table["cpus"]
        if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 0:
            raise ConfigError("[settings] cpus must be a whole number, 0 or more (0: all)")
        toolkit = _toolkit(table["toolkit"])
        images = _images(table.get("images", {}))
        work_dir = _path(table["work-dir"], root)
        return cls(
            store=resolve_store(
                _store(table["store"], STORE_ENV if "store" in from_env else "[settings] store"),
                from_env.get("store", root),
            ),
            wheelhouse=_path(table["wheelhouse"], root),
            work_dir=work_dir,
            venv_dir=_path(table["venv-dir"], root),
            memory_history=_path(table["memory-history"], from_env.get("memory-history", root)),
            runner=runner,
            memory=memory,
            cpus=cpus or None,
            base_image=table["base-image"],
            images=images,
            plat=table["plat"],
            toolkit=toolkit,
            compile_cache=_compile_cache(table.get("compile-cache"), root=root, work_dir=work_dir),
            manylinux=check_manylinux(table["manylinux"], "[settings]"),
            sysroot=_sysroot(table["sysroot"]),
        )

    @property
    def sysroots_dir(self) -> Path:
        """glibc sysroots and the target root filesystems of emulated import checks."""
        return sysroots_beside(self.work_dir)

    @property
    def toolkits_dir(self) -> Path:
        """CUDA toolkits made here (PyPI wheels, NVIDIA's redist archives): beside the work dir."""
        return self.work_dir.parent / "toolkits"

    def image_for(self, python: str | None = None) -> str:
        """The builder image for a Python version: ``[settings.images]`` ("3.13" = "image"), else
        ``base-image``. Versions that should share compiled kernels (the compile cache) need
        images with one compiler and one set of system headers: one Debian release."""
        if python is not None:
            want = parse_python(python)
            for version, image in self.images:
                if parse_python(version) == want:
                    return image
        return self.base_image


def sysroots_beside(work_dir: Path) -> Path:
    """Where sysroots live for a work dir: next to it, shared by every work dir beside it."""
    return work_dir.parent / "sysroots"


def default_settings(root: Path | None = None) -> Settings:
    """The settings of a matrix without a ``[settings]`` table."""
    return Settings.from_table({}, root=root or Path.cwd())


def resolve_store(spec: str, root: Path) -> str:
    """A store spec with a relative directory made absolute (from ``root``); URLs as they are."""
    if url_scheme(spec) is not None or Path(spec).is_absolute():
        return spec
    return str(root / spec)


def _path(value: str, root: Path) -> Path:
    p = Path(value)
    return p if p.is_absolute() else root / p


def _store(spec: str, where: str) -> str:
    try:
        open_store(spec)  # parses the spec; nothing is made or contacted
    except StoreError:
        raise ConfigError(f"{where} {spec!r} is not a directory or {URL_FORMS}") from None
    return spec


def check_manylinux(value: Any, where: str) -> str:
    """"2_28" (a manylinux policy auditwheel knows) or "auto"; ConfigError otherwise."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} manylinux must be a string like \"2_28\" or \"auto\"")
    if value == "auto":
        return value
    try:
        return floor_policy(value).name.removeprefix("manylinux_")
    except WheelError as exc:
        raise ConfigError(f"{where} manylinux: {exc.message}") from None


def _sysroot(value: str) -> str:
    if value not in SYSROOTS:
        raise ConfigError(f"[settings] sysroot {value!r} is not one of {', '.join(SYSROOTS)}")
    return value


def _runner(runner: str) -> str:
    if runner not in RUNNERS:
        raise ConfigError(f"[settings] runner {runner!r} is not one of {', '.join(RUNNERS)}")
    return runner


def _memory(memory: Any) -> int | None:
    if memory in ("auto", ""):
        return None
    try:
        if isinstance(memory, bool) or not isinstance(memory, (str, int)):
            raise ConfigError("must be \"auto\" or a size like \"16g\"")
        return parse_size(memory)
    except FactoryError as exc:
        raise ConfigError(f"[settings] memory: {exc.message}") from None


def _toolkit(toolkit: Any) -> tuple[str, ...]:
    sources = [toolkit] if isinstance(toolkit, str) else toolkit
    if not isinstance(sources, list) or not sources or not all(isinstance(t, str) for t in sources):
        raise ConfigError("[settings] toolkit must be a list of pypi, image, system")
    unknown = [s for s in sources if s not in TOOLKIT_SOURCES]
    if unknown:
        raise ConfigError(
            f"[settings] toolkit: unknown source {unknown[0]!r} (use pypi, image, system)"
        )
    return tuple(sources)


def _images(images: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(images, dict):
        raise ConfigError("[settings] images must be a table of Python version = image")
    for version, image in images.items():
        try:
            parse_python(str(version))
        except CellError as exc:
            raise ConfigError(f"[settings.images]: {exc.message}") from None
        if not isinstance(image, str) or not image:
            raise ConfigError(f"[settings.images] {version!r} must name an image")
    return tuple((str(version), image) for version, image in images.items())


def _compile_cache(raw: Any, *, root: Path, work_dir: Path) -> CompileCacheSettings:
    """``compile-cache = {dir, size, remote}``; the dir defaults to ``compile-cache`` next to the
    work dir."""
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ConfigError("[settings] compile-cache must be a table")
    check_keys(raw, COMPILE_CACHE_KEYS, "[settings.compile-cache]")
    remote = raw.get("remote") or None
    if remote is not None and not isinstance(remote, str):
        raise ConfigError('[settings.compile-cache] remote must be "store" or an s3:// URL')
    try:
        size = parse_size(str(raw.get("size", DEFAULT_CACHE_SIZE)), what="compile cache size")
    except UsageError as exc:
        raise ConfigError(f"[settings.compile-cache] size: {exc.message}") from None
    return CompileCacheSettings(
        dir=_path(str(raw["dir"]), root) if "dir" in raw else work_dir.parent / "compile-cache",
        size=sccache_size(size),
        remote=remote,
    )


def sccache_size(n: int) -> str:
    """Bytes in sccache's notation (``SCCACHE_CACHE_SIZE``): digits and the largest of K, M, G, T
    that divides them."""
    for exponent in (4, 3, 2, 1):
        if n % 1024**exponent == 0:
            return f"{n // 1024**exponent}{' KMGT'[exponent]}"
    return str(n)
