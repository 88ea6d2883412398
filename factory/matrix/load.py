"""matrix.toml -> validated Matrix -> expanded cells.

Every problem is found before any build starts and reported as one line (ConfigError).
Unknown keys get a did-you-mean suggestion.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from factory.matrix.cell import Cell, parse_arch, parse_cuda, parse_python, parse_version
from factory.errors import CellError, ConfigError
from factory.recipes import Recipe, get_recipe
from factory.toolchain.resolve import Toolchain, check_cell_cuda, resolve_toolchain

AXES = ("torch", "cuda", "archs", "python")
TOP_KEYS = {"version", "settings", "axes", "packages", "include", "exclude", "torch-indexes"}
PACKAGE_KEYS = {"recipe", "versions", "source", "sha256", *AXES}
SETTINGS_KEYS = {
    "store", "wheelhouse", "runner", "memory", "cpus", "base-image", "plat", "work-dir", "toolkit",
    "memory-history", "venv-dir",
    "images", "compile-cache",
}
RULE_KEYS = {"package", "version", *AXES, "reason"}

DEFAULT_SETTINGS: dict[str, Any] = {
    "store": "index/store",
    "wheelhouse": ".cache/factory/wheelhouse",
    "work-dir": ".cache/factory/work",
    "venv-dir": ".cache/factory/venvs",  # build venvs, shared by cells with the same torch
    "runner": "docker",
    "memory": "auto",
    "cpus": 0,  # 0: all the runner may use
    "base-image": "factory-base:bookworm",
    "plat": "auto",
    "toolkit": ["pypi", "image", "system"],  # where nvcc comes from, in order of preference
    # builds record measured memory here (layered over the shipped defaults); share it between
    # builders by pointing this (or $FACTORY_MEMORY_HISTORY) at a common file
    "memory-history": ".cache/factory/memory_history.json",
}


def _check_keys(table: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    allowed = set(allowed)
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown key {key!r} in {where}{hint}")


def _as_list(value: Any, where: str) -> list[Any]:
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{where} is an empty list")
        return value
    if isinstance(value, (str, int, float)):
        return [value]
    raise ConfigError(f"{where} must be a string or a list, not {type(value).__name__}")


def _archs_axis(value: Any, where: str) -> list[tuple[int, ...]]:
    """archs = ["10.0"] (one set), [["9.0"], ["10.0"]] (two sets), or "10.0"."""
    items = _as_list(value, where)
    if all(isinstance(v, list) for v in items):
        sets = items
    elif any(isinstance(v, list) for v in items):
        raise ConfigError(f"{where} mixes arch sets and single archs")
    else:
        sets = [items]
    out: list[tuple[int, ...]] = []
    for s in sets:
        if not s:
            raise ConfigError(f"{where} has an empty arch set")
        try:
            out.append(tuple(sorted({parse_arch(str(a)) for a in s})))
        except CellError as exc:
            raise ConfigError(f"{where}: {exc.message}") from None
    return out


def _scalar_axis(value: Any, where: str, parse: Any) -> list[str]:
    out = []
    for v in _as_list(value, where):
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise ConfigError(f"{where} must hold version strings")
        if isinstance(v, float):
            # TOML reads 2.10 as the number 2.1: a version written as a float loses digits.
            raise ConfigError(
                f"{where}: {v} is a TOML number; quote versions (\"2.10\" reads as 2.1)"
            )
        try:
            parse(str(v))
        except CellError as exc:
            raise ConfigError(f"{where}: {exc.message}") from None
        out.append(str(v))
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackageSpec:
    name: str
    recipe: Recipe
    versions: tuple[str, ...]
    source: str  # "pypi" or a path (relative to the matrix file's directory)
    sha256: str | None
    axes: dict[str, list[Any]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannedCell:
    """A cell with everything resolved that the later stages need."""

    cell: Cell
    recipe: Recipe
    toolchain: Toolchain
    source: str
    sha256: str | None
    content_key: str
    wheel: str  # the exact filename the cell will produce

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.cell.id,
            **self.cell.as_dict(),
            "variant": self.cell.variant,
            "recipe": self.recipe.name,
            "recipe_revision": self.recipe.revision,
            "content_key": self.content_key,
            "source": self.source,
            "wheel": self.wheel,
            "toolchain": self.toolchain.as_dict(),
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Matrix:
    path: Path | None
    root: Path  # directory relative paths are resolved against
    settings: dict[str, Any]
    packages: dict[str, PackageSpec]
    torch_indexes: dict[str, str]
    cells: tuple[PlannedCell, ...]

    def find(self, cell_id: str) -> PlannedCell:
        want = Cell.from_id(cell_id)
        for pc in self.cells:
            if pc.cell == want:
                return pc
        # A cell outside the matrix is fine (one-off requests) if its package is known.
        pkg = self.packages.get(want.package)
        if pkg is None:
            raise CellError(
                f"package {want.package!r} is not in the matrix",
                tip=f"known packages: {', '.join(sorted(self.packages)) or 'none'}",
            )
        return plan_cell(want, pkg, self)

    def source_path(self, pc: PlannedCell) -> Path | None:
        return None if pc.source == "pypi" else (self.root / pc.source).resolve()


def wheel_filename(cell: Cell, recipe: Recipe, plat: str) -> str:
    from factory.matrix.tags import local_tag

    local = local_tag(
        cuda=cell.cuda, torch_minor=cell.torch_minor, archs=cell.archs, default_archs=recipe.default_archs
    )
    dist = canonicalize_name(cell.package).replace("-", "_")
    return f"{dist}-{cell.version}+{local}-{cell.python_tag}-{cell.python_tag}-{plat}.whl"


def base_image_for(settings: Mapping[str, Any], python: str | None = None) -> str:
    """The builder image for a Python version: ``[settings.images]`` ("3.13" = "image"), else
    ``base-image``. Versions that should share compiled kernels (the compile cache) need images
    with one compiler and one set of system headers: one Debian release."""
    images = settings.get("images") or {}
    if python is not None:
        want = parse_python(python)
        for version, image in images.items():
            if parse_python(str(version)) == want:
                return str(image)
    return str(settings.get("base-image", DEFAULT_SETTINGS["base-image"]))


def _check_images(images: Any) -> None:
    if not isinstance(images, dict):
        raise ConfigError("[settings] images must be a table of Python version = image")
    for version, image in images.items():
        try:
            parse_python(str(version))
        except CellError as exc:
            raise ConfigError(f"[settings.images]: {exc.message}") from None
        if not isinstance(image, str) or not image:
            raise ConfigError(f"[settings.images] {version!r} must name an image")


_TEXT_SETTINGS = (
    "store", "wheelhouse", "work-dir", "venv-dir", "runner", "base-image", "plat",
    "memory-history",
)


def _check_settings(settings: dict[str, Any], root: Path) -> None:
    """Types and values of [settings], checked now: a wrong one must fail here in one line, not
    as a crash in the middle of a build."""
    from factory.units import parse_size
    from factory.errors import FactoryError
    from factory.runners import RUNNERS

    for key in _TEXT_SETTINGS:
        if not isinstance(settings.get(key), str) or not settings[key]:
            raise ConfigError(f"[settings] {key} must be a non-empty string")
    if settings["runner"] not in RUNNERS:
        raise ConfigError(
            f"[settings] runner {settings['runner']!r} is not one of {', '.join(RUNNERS)}"
        )
    memory = settings.get("memory")
    if memory not in ("auto", ""):
        try:
            if isinstance(memory, bool) or not isinstance(memory, (str, int)):
                raise ConfigError("must be \"auto\" or a size like \"16g\"")
            parse_size(memory)
        except FactoryError as exc:
            raise ConfigError(f"[settings] memory: {exc.message}") from None
    cpus = settings.get("cpus")
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 0:
        raise ConfigError("[settings] cpus must be a whole number, 0 or more (0: all)")
    toolkit = settings.get("toolkit")
    sources = [toolkit] if isinstance(toolkit, str) else toolkit
    if not isinstance(sources, list) or not sources or not all(isinstance(t, str) for t in sources):
        raise ConfigError("[settings] toolkit must be a list of pypi, image, system")
    _check_images(settings.get("images", {}))
    if "compile-cache" in settings:
        from factory.build.compile_cache import cache_settings

        cache = settings["compile-cache"]
        if isinstance(cache, dict):  # the remote is checked where it is used (--store may set it)
            cache = {k: v for k, v in cache.items() if k != "remote"}
        try:
            cache_settings({**settings, "compile-cache": cache}, root=root)
        except ConfigError:
            raise
        except FactoryError as exc:  # an unparseable size
            raise ConfigError(f"[settings] compile-cache: {exc.message}") from None


def default_plat(settings: Mapping[str, Any], python: str | None = None) -> str:
    plat = str(settings.get("plat", "auto"))
    if plat != "auto":
        return plat
    if settings.get("runner") == "local":
        # the local runner builds against this host's glibc, so the tag follows it
        import platform

        lib, ver = platform.libc_ver()
        if lib == "glibc" and ver:
            major, minor = ver.split(".")[:2]
            return f"manylinux_{major}_{minor}_{platform.machine()}"
    from factory.toolchain.images import plat_for_image

    return plat_for_image(base_image_for(settings, python))


def plan_cell(cell: Cell, pkg: PackageSpec, matrix: Matrix | None = None, *, settings: Mapping[str, Any] | None = None, torch_indexes: Mapping[str, str] | None = None) -> PlannedCell:
    settings = matrix.settings if matrix else (settings or DEFAULT_SETTINGS)
    torch_indexes = matrix.torch_indexes if matrix else (torch_indexes or {})
    try:
        check_cell_cuda(cell)
        pkg.recipe.check_cell(cell)
    except ConfigError:
        raise
    prefer = settings.get("toolkit", DEFAULT_SETTINGS["toolkit"])
    if isinstance(prefer, str):
        prefer = [prefer]
    unknown = [p for p in prefer if p not in ("pypi", "image", "system")]
    if unknown:
        raise ConfigError(f"[settings] toolkit: unknown source {unknown[0]!r} (use pypi, image, system)")
    toolchain = resolve_toolchain(cell, torch_indexes=dict(torch_indexes), prefer=tuple(prefer))
    return PlannedCell(
        cell=cell,
        recipe=pkg.recipe,
        toolchain=toolchain,
        source=pkg.source,
        sha256=pkg.sha256,
        content_key=cell.content_key(pkg.recipe.revision),
        wheel=wheel_filename(cell, pkg.recipe, default_plat(settings, cell.python)),
    )


def _rule_matches(rule: Mapping[str, Any], pkg: str, version: str, cell_axes: Mapping[str, Any]) -> bool:
    if "package" in rule and canonicalize_name(str(rule["package"])) != pkg:
        return False
    if "version" in rule and str(rule["version"]) != version:
        return False
    for axis in AXES:
        if axis not in rule:
            continue
        want = rule[axis]
        have = cell_axes[axis]
        if axis == "archs":
            if _archs_axis(want, "exclude.archs")[0] != have:
                return False
        elif axis == "python":
            if parse_python(str(want)) != parse_python(have):
                return False
        elif axis == "cuda":
            if parse_cuda(str(want)) != parse_cuda(have):
                return False
        elif axis == "torch" and len(Version(str(want)).release) == 2:
            # 'torch = "2.14"' means every 2.14.x, as the variant and the pin do.
            if Version(str(have)).release[:2] != Version(str(want)).release:
                return False
        elif str(want) != str(have):
            return False
    return True


def load_matrix(path: Path | None = None, *, text: str | None = None) -> Matrix:
    """Parse and validate; raises ConfigError with one line on the first problem."""
    if text is None:
        if path is None:
            path = Path("matrix.toml")
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise ConfigError(f"matrix file {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read matrix file {path}: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"matrix is not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nesting level
        raise ConfigError("matrix is not valid TOML: arrays or tables nested too deeply") from None
    root = path.parent.resolve() if path else Path.cwd()
    return _build_matrix(data, path=path, root=root)


def _build_matrix(data: dict[str, Any], *, path: Path | None, root: Path) -> Matrix:
    _check_keys(data, TOP_KEYS, "the matrix")
    if data.get("version", 1) != 1:
        raise ConfigError(f"matrix version {data.get('version')!r} is not supported (only 1)")
    settings = dict(DEFAULT_SETTINGS)
    raw_settings = data.get("settings", {})
    if not isinstance(raw_settings, dict):
        raise ConfigError("[settings] must be a table")
    _check_keys(raw_settings, SETTINGS_KEYS, "[settings]")
    settings.update(raw_settings)
    _check_settings(settings, root)

    torch_indexes = data.get("torch-indexes", {})
    if not isinstance(torch_indexes, dict):
        raise ConfigError("[torch-indexes] must be a table of CUDA version = URL")
    for k, v in torch_indexes.items():
        try:
            parse_cuda(k)
        except CellError as exc:
            raise ConfigError(f"[torch-indexes]: {exc.message}") from None
        if not isinstance(v, str) or not v.startswith(("http://", "https://", "file://")):
            raise ConfigError(f"[torch-indexes] {k!r} must be an http(s) or file URL")

    axes_raw = data.get("axes", {})
    if not isinstance(axes_raw, dict):
        raise ConfigError("[axes] must be a table")
    _check_keys(axes_raw, AXES, "[axes]")
    global_axes = _parse_axes(axes_raw, "axes")

    packages_raw = data.get("packages", {})
    if not isinstance(packages_raw, dict) or not packages_raw:
        raise ConfigError("the matrix declares no [packages.NAME] table")
    packages: dict[str, PackageSpec] = {}
    for name, spec in packages_raw.items():
        where = f"[packages.{name}]"
        if not isinstance(spec, dict):
            raise ConfigError(f"{where} must be a table")
        _check_keys(spec, PACKAGE_KEYS, where)
        recipe = get_recipe(str(spec.get("recipe", "torch-extension")))
        if "versions" not in spec:
            raise ConfigError(f"{where} needs versions = [...]")
        versions = _scalar_axis(spec["versions"], f"{where} versions", lambda v: parse_version(v, name))
        source = spec.get("source", "pypi")
        if not isinstance(source, str) or not source:
            raise ConfigError(f"{where} source must be 'pypi' or a directory path")
        if source != "pypi" and not (root / source).is_dir():
            raise ConfigError(f"{where} source directory {source!r} does not exist")
        sha = spec.get("sha256")
        if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
            raise ConfigError(f"{where} sha256 must be 64 hex digits")
        axes = dict(global_axes)
        axes.update(_parse_axes({k: spec[k] for k in AXES if k in spec}, f"packages.{name}"))
        for axis in AXES:
            if axis not in axes:
                raise ConfigError(f"{where} has no {axis} axis and [axes] sets none")
        cname = canonicalize_name(name)
        if cname in packages:
            raise ConfigError(f"package {name!r} is declared twice")
        packages[cname] = PackageSpec(
            name=cname, recipe=recipe, versions=tuple(versions), source=source, sha256=sha, axes=axes
        )

    rules: dict[str, list[dict[str, Any]]] = {}
    for kind in ("exclude", "include"):
        lst = data.get(kind, [])
        if not isinstance(lst, list) or not all(isinstance(r, dict) for r in lst):
            raise ConfigError(f"[[{kind}]] entries must be tables")
        for i, rule in enumerate(lst):
            _check_keys(rule, RULE_KEYS, f"[[{kind}]] #{i + 1}")
            if "package" in rule and canonicalize_name(str(rule["package"])) not in packages:
                raise ConfigError(f"[[{kind}]] #{i + 1} names unknown package {rule['package']!r}")
            # Parse the rule's values now: a typo must fail here, not match nothing or crash later.
            parsed = _parse_axes({a: rule[a] for a in AXES if a in rule}, f"[[{kind}]] #{i + 1}")
            if kind == "include":
                many = [a for a, v in parsed.items() if len(v) != 1]
                if many:
                    raise ConfigError(
                        f"[[include]] #{i + 1} {many[0]} must be one value (one cell per include)"
                    )
        rules[kind] = lst

    matrix = Matrix(
        path=path, root=root, settings=settings, packages=packages,
        torch_indexes=dict(torch_indexes), cells=(),
    )
    cells: dict[Cell, PlannedCell] = {}
    for pkg in packages.values():
        for version, torch, cuda, archs, python in itertools.product(
            pkg.versions, pkg.axes["torch"], pkg.axes["cuda"], pkg.axes["archs"], pkg.axes["python"]
        ):
            values = {"torch": torch, "cuda": cuda, "archs": archs, "python": python}
            if any(_rule_matches(r, pkg.name, version, values) for r in rules["exclude"]):
                continue
            cell = Cell(package=pkg.name, version=version, torch=torch, cuda=cuda, archs=archs, python=python)
            cells[cell] = plan_cell(cell, pkg, matrix)
    for i, rule in enumerate(rules["include"]):
        where = f"[[include]] #{i + 1}"
        if "package" not in rule:
            raise ConfigError(f"{where} needs package")
        pkg = packages[canonicalize_name(str(rule["package"]))]
        missing = [a for a in AXES if a not in rule]
        if missing:
            raise ConfigError(f"{where} needs {', '.join(missing)}")
        version = str(rule.get("version", pkg.versions[0]))
        try:
            parse_version(version, pkg.name)
        except CellError as exc:
            raise ConfigError(f"{where}: {exc.message}") from None
        values = _parse_axes({a: rule[a] for a in AXES}, where)
        cell = Cell(
            package=pkg.name, version=version, torch=values["torch"][0], cuda=values["cuda"][0],
            archs=values["archs"][0], python=values["python"][0],
        )
        cells[cell] = plan_cell(cell, pkg, matrix)
    if not cells:
        raise ConfigError("the matrix expands to no cells (everything excluded?)")
    return dataclasses.replace(matrix, cells=tuple(sorted(cells.values(), key=lambda p: p.cell.id)))


def _parse_axes(raw: Mapping[str, Any], where: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for axis, value in raw.items():
        w = f"{where}.{axis}"
        if axis == "archs":
            out[axis] = _archs_axis(value, w)
        elif axis == "torch":
            out[axis] = _scalar_axis(value, w, lambda v: parse_version(v, "torch"))
        elif axis == "cuda":
            out[axis] = _scalar_axis(value, w, parse_cuda)
        elif axis == "python":
            out[axis] = _scalar_axis(value, w, parse_python)
    return out


def default_matrix_path() -> Path:
    """matrix.toml in the current directory, else the one shipped next to the package."""
    here = Path("matrix.toml")
    if here.exists():
        return here
    shipped = Path(__file__).resolve().parents[2] / "matrix.toml"
    return shipped
