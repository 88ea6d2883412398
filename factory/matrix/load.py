"""matrix.toml -> validated Matrix -> expanded cells.

Every problem is found before any build starts and reported as one line (ConfigError).
Unknown keys get a did-you-mean suggestion.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import itertools
import platform as _platform
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from factory.environment import MATRIX_ENV, env_value
from factory.errors import CellError, ConfigError, ConfigErrors
from factory.matrix.cell import (
    DEFAULT_PLATFORM,
    Cell,
    parse_arch,
    parse_cuda,
    parse_platform,
    parse_python,
    parse_version,
)
from factory.matrix.manylinux import host_glibc, manylinux_name, plat_for_image
from factory.matrix.settings import Settings, check_keys, check_manylinux, default_settings
from factory.matrix.tags import local_tag, parse_local, plat_for_platform
from factory.recipes import Recipe, get_recipe
from factory.runners import runner_kind
from factory.tomlread import tomllib
from factory.toolchain.resolve import Toolchain, check_cell_cuda, resolve_toolchain
from factory.toolchain.sdist import check_sdist_exists

AXES = ("torch", "cuda", "archs", "python", "platform")
# Axes a matrix may leave out, and the value they then take.
AXIS_DEFAULTS: dict[str, list[Any]] = {"platform": [DEFAULT_PLATFORM]}
TOP_KEYS = {"version", "settings", "axes", "packages", "include", "exclude", "torch-indexes"}
PACKAGE_KEYS = {"recipe", "versions", "source", "sha256", "manylinux", *AXES}
RULE_KEYS = {"package", "version", *AXES, "reason", "manylinux"}


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
    manylinux: str | None = None  # the package's glibc floor, over [settings] manylinux


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannedCell:
    """A cell with everything resolved that the later stages need."""

    cell: Cell
    recipe: Recipe
    toolchain: Toolchain
    source: str
    sha256: str | None
    content_key: str
    local: str  # the wheel's local version tag: 'cu130torch2.14sm100' (matrix/tags.py)
    variant: str  # its per-variant index: 'cu130-torch2.14-sm100' (the arch set unless the default)
    wheel: str  # the exact filename the cell will produce
    manylinux: str = "auto"  # the promised glibc floor ("2_28"), or "auto": the builder's

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.cell.id,
            **self.cell.as_dict(),
            "variant": self.variant,
            "recipe": self.recipe.name,
            "recipe_revision": self.recipe.revision,
            "content_key": self.content_key,
            "source": self.source,
            "wheel": self.wheel,
            "manylinux": self.manylinux,
            "toolchain": self.toolchain.as_dict(),
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Matrix:
    path: Path | None
    root: Path  # directory relative paths are resolved against
    settings: Settings
    packages: dict[str, PackageSpec]
    torch_indexes: dict[str, str]
    cells: tuple[PlannedCell, ...]

    def short_id(self, cell: Cell) -> str:
        """The cell's short id (``Cell.short_id``), with the package version and the full torch
        version where another cell of this matrix has the same short id."""
        short = cell.short_id
        same = [pc.cell for pc in self.cells if pc.cell.short_id == short and pc.cell != cell]
        if not same:
            return short
        return short.replace("@", f"-{cell.version}@", 1).replace(
            f"-torch{cell.torch_minor}-", f"-torch{cell.torch}-", 1)

    def nearest(self, cell_id: str) -> str | None:
        """The matrix's cell id that reads most like ``cell_id`` (a typo's fix)."""
        ids = [pc.cell.id for pc in self.cells]
        close = difflib.get_close_matches(cell_id.strip().lower(), ids, n=1, cutoff=0.0)
        return close[0] if close else None

    def find(self, cell_id: str, *, outside: bool = False) -> PlannedCell:
        """The matrix's cell of this id; with ``outside`` (a one-off request, a rebuild of a
        published one-off) also a cell the matrix does not list, if its package is known and
        the version exists. Else one line naming the matrix's nearest cell."""
        nearest = self.nearest(cell_id)
        hint = f"; the nearest matrix cell is {nearest}" if nearest else ""
        try:
            want = Cell.from_id(cell_id)
        except CellError as exc:
            raise CellError(exc.message + hint, tip=exc.tip) from None
        for pc in self.cells:
            if pc.cell == want:
                return pc
        if not outside:
            where = f" {self.path}" if self.path else ""
            raise CellError(f"{want.id} is not a cell of the matrix{where}{hint}",
                            tip="'factory matrix' lists its cells; 'factory request' builds a "
                            "cell outside it")
        pkg = self.package(want.package)
        if want.version not in pkg.versions:
            pkg = self._other_version(pkg, want.version)
        return plan_cell(want, pkg, self)

    def _other_version(self, pkg: PackageSpec, version: str) -> PackageSpec:
        known = ", ".join(pkg.versions)
        if pkg.source != "pypi":
            raise CellError(
                f"{pkg.name} {version} is not in the matrix; its source directory "
                f"{pkg.source!r} is built as {known}",
                tip="add the version to the package's versions in the matrix",
            )
        try:
            check_sdist_exists(pkg.name, version, self.settings.wheelhouse / "sdists")
        except CellError as exc:
            raise CellError(f"{exc.message}; the matrix has {pkg.name} {known}") from None
        return dataclasses.replace(pkg, sha256=None)  # the matrix's pin is for its own version

    def package(self, name: str) -> PackageSpec:
        """The package called ``name``; else one line with a did-you-mean."""
        pkg = self.packages.get(canonicalize_name(name))
        if pkg is None:
            close = difflib.get_close_matches(canonicalize_name(name), self.packages, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CellError(
                f"package {name!r} is not in the matrix{hint}",
                tip=f"known packages: {', '.join(sorted(self.packages)) or 'none'}",
            )
        return pkg

    def cells_of(self, packages: Iterable[str] | None) -> list[PlannedCell]:
        """The matrix's cells, only those of ``packages`` when given (each must exist)."""
        if not packages:
            return list(self.cells)
        want = {self.package(name).name for name in packages}
        return [pc for pc in self.cells if pc.cell.package in want]


def wheel_filename(cell: Cell, local: str, plat: str) -> str:
    """The file a cell's build produces, with its local version tag ``local``."""
    dist = canonicalize_name(cell.package).replace("-", "_")
    return f"{dist}-{cell.version}+{local}-{cell.python_tag}-{cell.python_tag}-{plat}.whl"


def default_plat(
    settings: Settings, python: str | None = None, platform: str = DEFAULT_PLATFORM
) -> str:
    """The wheel's platform tag: the build environment's glibc floor, the cell's CPU."""
    return plat_for_platform(_environment_plat(settings, python), platform)


def _environment_plat(settings: Settings, python: str | None) -> str:
    if settings.plat != "auto":
        return settings.plat
    if runner_kind(settings.runner).host_glibc:
        # a runner on this host links against its glibc, so the tag follows it
        glibc = host_glibc()
        if glibc is not None:
            return f"{manylinux_name(glibc)}_{_platform.machine()}"
    return plat_for_image(settings.image_for(python))


def cell_plat(settings: Settings, cell: Cell, manylinux: str) -> str:
    """The platform tag a cell's wheel promises: its floor's, or the builder's for "auto";
    for the cell's CPU."""
    if manylinux == "auto":
        return default_plat(settings, cell.python, cell.platform)
    return f"manylinux_{manylinux}_{cell.platform}"


def plan_cell(cell: Cell, pkg: PackageSpec, matrix: Matrix | None = None, *,
              settings: Settings | None = None,
              torch_indexes: Mapping[str, str] | None = None,
              manylinux: str | None = None) -> PlannedCell:
    settings = matrix.settings if matrix else (settings or default_settings())
    torch_indexes = matrix.torch_indexes if matrix else (torch_indexes or {})
    try:
        check_cell_cuda(cell)
        pkg.recipe.check_cell(cell)
    except ConfigError:
        raise
    toolchain = resolve_toolchain(cell, torch_indexes=dict(torch_indexes), prefer=settings.toolkit)
    floor = manylinux or pkg.manylinux or settings.manylinux
    local = local_tag(cuda=cell.cuda, torch_minor=cell.torch_minor, archs=cell.archs,
                      default_archs=pkg.recipe.default_archs)
    return PlannedCell(
        cell=cell,
        recipe=pkg.recipe,
        toolchain=toolchain,
        source=pkg.source,
        sha256=pkg.sha256,
        content_key=cell.content_key(pkg.recipe.revision, manylinux=floor),
        local=local,
        variant=parse_local(local).variant,
        wheel=wheel_filename(cell, local, cell_plat(settings, cell, floor)),
        manylinux=floor,
    )


def _rule_matches(rule: Mapping[str, Any], pkg: str, version: str,
                  cell_axes: Mapping[str, Any]) -> bool:
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
        elif axis == "platform":
            if parse_platform(str(want)) != have:
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


class _Problems:
    """Collects the ConfigErrors of independent parts of a matrix, so one run reports them all
    (one line each); each part still stops at its own first problem."""

    def __init__(self) -> None:
        self.found: list[ConfigError] = []

    @contextlib.contextmanager
    def part(self) -> Iterator[None]:
        try:
            yield
        except ConfigError as exc:
            if exc.message not in {p.message for p in self.found}:
                self.found.append(exc)

    def raise_any(self) -> None:
        if len(self.found) == 1:
            raise self.found[0]
        if self.found:
            raise ConfigErrors(self.found)


def _build_matrix(data: dict[str, Any], *, path: Path | None, root: Path) -> Matrix:
    """Checked in the file's order; independent parts (settings, axes, each package, each rule)
    are all checked, so every problem is reported at once."""
    check_keys(data, TOP_KEYS, "the matrix")  # a misspelt table: what follows would be noise
    problems = _Problems()
    if data.get("version", 1) != 1:
        raise ConfigError(f"matrix version {data.get('version')!r} is not supported (only 1)")
    settings = default_settings()
    with problems.part():
        raw_settings = data.get("settings", {})
        if not isinstance(raw_settings, dict):
            raise ConfigError("[settings] must be a table")
        settings = Settings.from_table(raw_settings, root=root)
    torch_indexes: dict[str, str] = {}
    with problems.part():
        torch_indexes = _torch_indexes(data.get("torch-indexes", {}))
    global_axes: dict[str, list[Any]] | None = None
    with problems.part():
        axes_raw = data.get("axes", {})
        if not isinstance(axes_raw, dict):
            raise ConfigError("[axes] must be a table")
        check_keys(axes_raw, AXES, "[axes]")
        global_axes = _parse_axes(axes_raw, "axes")
    packages = _packages(data.get("packages", {}), root=root, global_axes=global_axes,
                         problems=problems)
    rules: dict[str, list[dict[str, Any]]] = {}
    for kind in ("exclude", "include"):
        with problems.part():
            raw_packages = data.get("packages", {})
            # no usable [packages]: that is its own problem, not one of every rule naming one
            declared = raw_packages if isinstance(raw_packages, dict) and raw_packages else None
            rules[kind] = _rules(data, kind, declared, problems)
    problems.raise_any()
    matrix = Matrix(
        path=path, root=root, settings=settings, packages=packages,
        torch_indexes=torch_indexes, cells=(),
    )
    cells = _expand(matrix, excludes=rules["exclude"], includes=rules["include"], problems=problems)
    problems.raise_any()
    return dataclasses.replace(matrix, cells=cells)


def _torch_indexes(raw: Any) -> dict[str, str]:
    """``[torch-indexes]``: CUDA version = the PyTorch index URL for its torch builds."""
    if not isinstance(raw, dict):
        raise ConfigError("[torch-indexes] must be a table of CUDA version = URL")
    for k, v in raw.items():
        try:
            parse_cuda(k)
        except CellError as exc:
            raise ConfigError(f"[torch-indexes]: {exc.message}") from None
        if not isinstance(v, str) or not v.startswith(("http://", "https://", "file://")):
            raise ConfigError(f"[torch-indexes] {k!r} must be an http(s) or file URL")
    return dict(raw)


def _packages(raw: Any, *, root: Path, global_axes: Mapping[str, list[Any]] | None,
              problems: _Problems) -> dict[str, PackageSpec]:
    """Every ``[packages.NAME]`` that is valid; the problems of the others go to ``problems``."""
    if not isinstance(raw, dict) or not raw:
        with problems.part():
            raise ConfigError("the matrix declares no [packages.NAME] table")
        return {}
    packages: dict[str, PackageSpec] = {}
    for name, spec in raw.items():
        with problems.part():
            pkg = _package(name, spec, root=root, global_axes=global_axes)
            if pkg.name in packages:
                raise ConfigError(f"package {name!r} is declared twice")
            packages[pkg.name] = pkg
    return packages


def _package(name: str, spec: Any, *, root: Path,
             global_axes: Mapping[str, list[Any]] | None) -> PackageSpec:
    """One ``[packages.NAME]`` table; its own axes override the global ones."""
    where = f"[packages.{name}]"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a table")
    check_keys(spec, PACKAGE_KEYS, where)
    recipe = get_recipe(str(spec.get("recipe", "torch-extension")))
    if "versions" not in spec:
        raise ConfigError(f"{where} needs versions = [...]")
    versions = _scalar_axis(spec["versions"], f"{where} versions", lambda v: parse_version(v, name))
    source = spec.get("source", "pypi")
    if not isinstance(source, str) or not source:
        raise ConfigError(f"{where} source must be 'pypi' or a directory path")
    if source != "pypi" and not (root / source).is_dir():
        looked = (root / source).resolve()
        raise ConfigError(
            f"{where} source directory {source!r} does not exist (looked for {looked}; "
            "a relative source counts from the matrix file's directory)"
        )
    sha = spec.get("sha256")
    if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
        raise ConfigError(f"{where} sha256 must be 64 hex digits")
    axes = dict(global_axes or {})
    axes.update(_parse_axes({k: spec[k] for k in AXES if k in spec}, f"packages.{name}"))
    for axis in AXES:
        if axis not in axes and axis in AXIS_DEFAULTS:
            axes[axis] = list(AXIS_DEFAULTS[axis])
        if axis not in axes and global_axes is not None:  # else [axes] has its own problem
            raise ConfigError(f"{where} has no {axis} axis and [axes] sets none")
    floor = check_manylinux(spec["manylinux"], where) if "manylinux" in spec else None
    return PackageSpec(
        name=canonicalize_name(name), recipe=recipe, versions=tuple(versions), source=source,
        sha256=sha, axes=axes, manylinux=floor,
    )


def _rules(data: Mapping[str, Any], kind: str, declared: Iterable[str] | None,
           problems: _Problems) -> list[dict[str, Any]]:
    """``[[exclude]]`` or ``[[include]]``, their values parsed now: a typo must fail here, not
    match nothing or crash later. ``declared``: the package names the matrix declares (None:
    unknown, as [packages] itself is broken)."""
    lst = data.get(kind, [])
    if not isinstance(lst, list) or not all(isinstance(r, dict) for r in lst):
        raise ConfigError(f"[[{kind}]] entries must be tables")
    names = None if declared is None else {canonicalize_name(str(n)) for n in declared}
    for i, rule in enumerate(lst):
        with problems.part():
            check_keys(rule, RULE_KEYS, f"[[{kind}]] #{i + 1}")
            if (names is not None and "package" in rule
                    and canonicalize_name(str(rule["package"])) not in names):
                raise ConfigError(
                    f"[[{kind}]] #{i + 1} names unknown package {rule['package']!r}"
                )
            parsed = _parse_axes({a: rule[a] for a in AXES if a in rule}, f"[[{kind}]] #{i + 1}")
            if "manylinux" in rule:
                if kind == "exclude":
                    raise ConfigError(f"[[exclude]] #{i + 1}: manylinux is not a cell axis "
                                      "(a cell has one floor); exclude by package or axes")
                rule["manylinux"] = check_manylinux(rule["manylinux"], f"[[include]] #{i + 1}")
            if kind == "include":
                many = [a for a, v in parsed.items() if len(v) != 1]
                if many:
                    raise ConfigError(
                        f"[[include]] #{i + 1} {many[0]} must be one value (one cell per include)"
                    )
    return lst


def _expand(matrix: Matrix, *, excludes: list[dict[str, Any]], includes: list[dict[str, Any]],
            problems: _Problems) -> tuple[PlannedCell, ...]:
    """The product of each package's axes, minus the excluded cells, plus the included ones.
    A cell that cannot be planned is a problem of its own (the same one reported once)."""
    cells: dict[Cell, PlannedCell] = {}
    for pkg in matrix.packages.values():
        for version, torch, cuda, archs, python, platform in itertools.product(
            pkg.versions, pkg.axes["torch"], pkg.axes["cuda"], pkg.axes["archs"],
            pkg.axes["python"], pkg.axes["platform"],
        ):
            values = {"torch": torch, "cuda": cuda, "archs": archs, "python": python,
                      "platform": platform}
            if any(_rule_matches(r, pkg.name, version, values) for r in excludes):
                continue
            cell = Cell(package=pkg.name, version=version, torch=torch, cuda=cuda, archs=archs,
                        python=python, platform=platform)
            with problems.part():
                cells[cell] = plan_cell(cell, pkg, matrix)
    for i, rule in enumerate(includes):
        with problems.part():
            pkg, cell = _included_cell(rule, f"[[include]] #{i + 1}", matrix.packages)
            cells[cell] = plan_cell(cell, pkg, matrix, manylinux=rule.get("manylinux"))
    if not cells and not problems.found:
        raise ConfigError("the matrix expands to no cells (everything excluded?)")
    return tuple(sorted(cells.values(), key=lambda p: p.cell.id))


def _included_cell(rule: Mapping[str, Any], where: str,
                   packages: Mapping[str, PackageSpec]) -> tuple[PackageSpec, Cell]:
    """The one cell an ``[[include]]`` names (every axis given; the version defaults to the
    package's first)."""
    if "package" not in rule:
        raise ConfigError(f"{where} needs package")
    pkg = packages[canonicalize_name(str(rule["package"]))]
    missing = [a for a in AXES if a not in rule and a not in AXIS_DEFAULTS]
    if missing:
        raise ConfigError(f"{where} needs {', '.join(missing)}")
    version = str(rule.get("version", pkg.versions[0]))
    try:
        parse_version(version, pkg.name)
    except CellError as exc:
        raise ConfigError(f"{where}: {exc.message}") from None
    values = {**AXIS_DEFAULTS, **_parse_axes({a: rule[a] for a in AXES if a in rule}, where)}
    cell = Cell(
        package=pkg.name, version=version, torch=values["torch"][0], cuda=values["cuda"][0],
        archs=values["archs"][0], python=values["python"][0], platform=values["platform"][0],
    )
    return pkg, cell


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
        elif axis == "platform":
            out[axis] = [parse_platform(v) for v in _scalar_axis(value, w, parse_platform)]
    return out


def default_matrix_path() -> Path | None:
    """$FACTORY_MATRIX, else matrix.toml in the current directory, else the checkout's own when
    the package runs from one (an editable install called from elsewhere); None when there is
    none, as for an installed wheel outside a checkout."""
    named = env_value(MATRIX_ENV)
    if named:
        return Path(named)
    here = Path("matrix.toml")
    if here.exists():
        return here
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "matrix.toml").is_file() and (checkout / "pyproject.toml").is_file():
        return checkout / "matrix.toml"
    return None


def matrix_path(explicit: Path | None = None) -> Path:
    """--matrix, else ``default_matrix_path()``; one line (ConfigError) when there is none."""
    path = explicit or default_matrix_path()
    if path is None:
        raise ConfigError(
            f"no matrix.toml in {Path.cwd()}",
            tip=f"run in the directory that holds it, or pass --matrix FILE or set {MATRIX_ENV}",
        )
    return path
