"""matrix.toml -> validated Matrix -> expanded cells.

Every problem is found before any build starts and reported as one line (ConfigError).
Unknown keys get a did-you-mean suggestion.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import platform as _platform
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from factory.errors import CellError, ConfigError, ConfigErrors
from factory.matrix.cell import (
    DEFAULT_PLATFORM,
    Cell,
    parse_cuda,
    parse_platform,
    parse_python,
    parse_version,
)
from factory.matrix.expand import Skipped, locked_cell, product
from factory.matrix.indexes import indexes_table, torch_indexes_table
from factory.matrix.lock import (
    Lock,
    LockedCell,
    lock_path,
    matrix_digest,
    read_lock,
    rests_on_declared,
)
from factory.matrix.manylinux import host_glibc, manylinux_name, plat_for_image
from factory.matrix.nearest import nearest_cell_id
from factory.matrix.package import (
    AXES,
    AXIS_DEFAULTS,
    AXIS_MODIFIERS,
    PackageSpec,
    archs_axis,
    parse_axes,
    parse_package,
)
from factory.matrix.rules import (
    cuda_rule,
    python_rule,
    resolve_versions,
    torch_rule,
)
from factory.matrix.settings import Settings, check_keys, check_manylinux, default_settings
from factory.matrix.tags import local_tag, parse_local, plat_for_platform
from factory.recipes import Recipe, declared_recipes
from factory.runners import runner_kind
from factory.tomlread import tomllib
from factory.toolchain.resolve import Toolchain, check_cell_archs, resolve_toolchain
from factory.toolchain.sdist import check_sdist_exists
from factory.upstream.facts import Facts, load_facts
from factory.upstream.read import Indexes

TOP_KEYS = {"version", "settings", "axes", "packages", "include", "exclude", "torch-indexes",
            "indexes",
            "recipes"}
RULE_KEYS = {"package", "version", *AXES, "reason", "manylinux"}


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
    sdist: str | None = None  # the sdist's filename, where the facts or the lock name it
    torch_wheel: str | None = None  # the torch wheel the build installs, and its sha256
    torch_sha256: str | None = None
    cuda_release: str | None = None  # the CUDA release torch's build pins ("13.0.3")

    @property
    def torch_declared(self) -> bool:
        """Its torch build was declared, not read from an index (matrix/lock.py)."""
        return rests_on_declared(self.toolchain.torch_index, self.torch_wheel)

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
            "sdist": self.sdist,
            "sha256": self.sha256,
            "torch_wheel": self.torch_wheel,
            "torch_sha256": self.torch_sha256,
            "cuda_release": self.cuda_release,
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Matrix:
    path: Path | None
    root: Path  # directory relative paths are resolved against
    settings: Settings
    packages: dict[str, PackageSpec]
    torch_indexes: dict[str, str]
    cells: tuple[PlannedCell, ...]
    facts: Facts  # what the indexes list (the cache under the work dir, else the snapshot)
    indexes: Indexes = Indexes()
    skipped: tuple[Skipped, ...] = ()  # cells the matrix names that cannot be built
    lock: Lock | None = None  # the lock the cells come from, when it matches the matrix
    lock_state: str = "none"  # "locked" | "stale" (matrix.toml changed since) | "none"
    digest: str = ""  # of the matrix's rules, as a lock records it

    @property
    def lock_file(self) -> Path | None:
        return lock_path(self.path) if self.path else None

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
        """The matrix cell nearest to ``cell_id``: the fewest axes changed (matrix/nearest.py)."""
        return nearest_cell_id(cell_id, [pc.cell for pc in self.cells])

    def find(self, cell_id: str, *, outside: bool = False) -> PlannedCell:
        """The matrix's cell of this id; with ``outside`` (a one-off request, a rebuild of a
        published one-off) also a cell the matrix does not list, if its package is known and
        the version exists. Else one line naming the matrix's nearest cell; a cell that cannot
        be built (the matrix knows it, or its plan says so) is a cell error too."""

        def hint() -> str:
            nearest = self.nearest(cell_id)
            return f"; the nearest matrix cell is {nearest}" if nearest else ""

        try:
            want = Cell.from_id(cell_id)
        except CellError as exc:
            raise CellError(exc.message + hint(), tip=exc.tip) from None
        for pc in self.cells:
            if pc.cell == want:
                return pc
        for skip in self.skipped:
            if skip.cell == want.id:
                where = "" if want.id in skip.reason else f" ({want.id})"
                raise CellError(f"{skip.reason}{where}{hint()}",
                                tip="the matrix knows this cell will not build ('factory matrix' "
                                "lists those with their reasons)")
        if not outside:
            where = f" {self.path}" if self.path else ""
            raise CellError(f"{want.id} is not a cell of the matrix{where}{hint()}",
                            tip="'factory matrix' lists its cells; 'factory request' builds a "
                            "cell outside it")
        # A cell outside the matrix is fine (one-off requests) if its package is known and the
        # version exists.
        pkg = self.package(want.package)
        if want.version not in pkg.versions:
            pkg = self._other_version(pkg, want.version)
        try:
            return plan_cell(want, pkg, self)
        except ConfigError as exc:  # the cell's fault, not the matrix file's
            raise CellError(exc.message + hint(), tip=exc.tip) from None

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
              manylinux: str | None = None,
              locked: LockedCell | None = None) -> PlannedCell:
    """Everything the later stages need for ``cell``. Checked against the facts (does torch
    ship this CUDA for this CPU and Python?), or taken as the lock has it (``locked``)."""
    settings = matrix.settings if matrix else (settings or default_settings())
    torch_indexes = matrix.torch_indexes if matrix else (torch_indexes or {})
    facts = matrix.facts if matrix else load_facts(settings.work_dir)
    check_cell_archs(cell)
    pkg.recipe.check_cell(cell)
    if locked is not None:
        index = None if locked.torch_index == "pypi" else locked.torch_index
        sdist, sha256 = locked.sdist, locked.sha256
        torch_wheel, torch_sha256 = locked.torch_wheel, locked.torch_sha256
        release = locked.cuda_release
    else:
        build = facts.build_for(torch=cell.torch, cuda=cell.cuda, platform=cell.platform,
                                python=cell.python)
        index = build.index
        wheel = build.files[cell.platform][cell.python]
        torch_wheel, torch_sha256 = (wheel.filename or None), wheel.sha256
        release = build.release
        sdist, sha256 = pkg.sha256_of(cell.version, facts)
    if index is not None:
        index = torch_indexes.get(cell.cuda, index)  # [torch-indexes]: a mirror of it
    toolchain = resolve_toolchain(cell, torch_index=index, prefer=settings.toolkit)
    floor = manylinux or pkg.manylinux or settings.manylinux
    local = local_tag(cuda=cell.cuda, torch_minor=cell.torch_minor, archs=cell.archs,
                      default_archs=pkg.recipe.default_archs)
    return PlannedCell(
        cell=cell,
        recipe=pkg.recipe,
        toolchain=toolchain,
        source=pkg.source,
        sha256=sha256,
        content_key=cell.content_key(pkg.recipe.revision, manylinux=floor),
        local=local,
        variant=parse_local(local).variant,
        wheel=wheel_filename(cell, local, cell_plat(settings, cell, floor)),
        manylinux=floor,
        sdist=sdist,
        torch_wheel=torch_wheel,
        torch_sha256=torch_sha256,
        cuda_release=release,
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
            if archs_axis(want, "exclude.archs")[0] != have:
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


def load_matrix(path: Path | None = None, *, text: str | None = None, use_lock: bool = True,
                facts: Facts | None = None, expand: bool = True) -> Matrix:
    """Parse and validate; raises ConfigError with one line on the first problem.

    The cells come from ``<matrix>.lock`` while it matches the matrix (``use_lock``), else
    from resolving the matrix's rules against ``facts`` (default: what this builder knows,
    never the network). ``expand`` False: the settings and packages only, no cells (what
    ``factory lock`` needs before it has read the indexes)."""
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
    return _build_matrix(data, path=path, root=root, use_lock=use_lock, facts=facts,
                         expand=expand)


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


def _build_matrix(data: dict[str, Any], *, path: Path | None, root: Path, use_lock: bool,
                  facts: Facts | None, expand: bool) -> Matrix:
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
        torch_indexes = torch_indexes_table(data.get("torch-indexes", {}))
    indexes = Indexes()
    with problems.part():
        indexes = indexes_table(data.get("indexes", {}))
    global_axes: dict[str, list[Any]] | None = None
    with problems.part():
        axes_raw = data.get("axes", {})
        if not isinstance(axes_raw, dict):
            raise ConfigError("[axes] must be a table")
        check_keys(axes_raw, {*AXES, *AXIS_MODIFIERS}, "[axes]")
        global_axes = parse_axes(axes_raw, "axes")
    recipes: dict[str, Recipe] = {}
    with problems.part():
        recipes = declared_recipes(data.get("recipes", {}), origin=str(path or "the matrix"))
    packages = _packages(data.get("packages", {}), root=root, global_axes=global_axes,
                         problems=problems, recipes=recipes)
    rules: dict[str, list[dict[str, Any]]] = {}
    for kind in ("exclude", "include"):
        with problems.part():
            raw_packages = data.get("packages", {})
            # no usable [packages]: that is its own problem, not one of every rule naming one
            declared = raw_packages if isinstance(raw_packages, dict) and raw_packages else None
            rules[kind] = _rules(data, kind, declared, problems)
    problems.raise_any()
    digest = matrix_digest(data)
    lock = read_lock(lock_path(path)) if (path is not None and use_lock) else None
    state = "none" if lock is None else ("locked" if lock.matrix == digest else "stale")
    if state != "locked":
        lock = None
    matrix = Matrix(
        path=path, root=root, settings=settings, packages=packages,
        torch_indexes=torch_indexes, cells=(), indexes=indexes,
        facts=facts if facts is not None else load_facts(settings.work_dir),
        lock=lock, lock_state=state, digest=digest,
    )
    if not expand:
        return matrix
    matrix = _resolve_versions(matrix, problems)
    problems.raise_any()
    cells, skipped = _expand(matrix, excludes=rules["exclude"], includes=rules["include"],
                             problems=problems)
    problems.raise_any()
    return dataclasses.replace(matrix, cells=cells, skipped=skipped)


def _resolve_versions(matrix: Matrix, problems: _Problems) -> Matrix:
    """Each package's versions: the lock's, or its rules resolved against the facts."""
    packages = dict(matrix.packages)
    for name, pkg in matrix.packages.items():
        with problems.part():
            if matrix.lock is not None:
                versions = list(dict.fromkeys(c.version for c in matrix.lock.cells
                                              if c.package == name))
                versions = versions or [r.text for r in pkg.version_rules if not r.tracking]
            else:
                releases = matrix.facts.packages.get(name) if pkg.source == "pypi" else None
                versions = resolve_versions(pkg.version_rules, name, releases)
            packages[name] = dataclasses.replace(pkg, versions=tuple(versions))
    return dataclasses.replace(matrix, packages=packages)


def _packages(raw: Any, *, root: Path, global_axes: Mapping[str, list[Any]] | None,
              problems: _Problems, recipes: Mapping[str, Recipe]) -> dict[str, PackageSpec]:
    """Every ``[packages.NAME]`` that is valid; the problems of the others go to ``problems``."""
    if not isinstance(raw, dict) or not raw:
        with problems.part():
            raise ConfigError("the matrix declares no [packages.NAME] table")
        return {}
    packages: dict[str, PackageSpec] = {}
    for name, spec in raw.items():
        with problems.part():
            pkg = parse_package(name, spec, root=root, global_axes=global_axes,
                                recipes=recipes)
            if pkg.name in packages:
                raise ConfigError(f"package {name!r} is declared twice")
            packages[pkg.name] = pkg
    return packages


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
            parsed = parse_axes({a: rule[a] for a in AXES if a in rule}, f"[[{kind}]] #{i + 1}")
            for axis, rule_of in (("torch", torch_rule), ("cuda", cuda_rule),
                                  ("python", python_rule)):
                for v in parsed.get(axis, []):
                    if rule_of(str(v), axis).tracking:
                        raise ConfigError(f"[[{kind}]] #{i + 1} {axis} {v!r}: a rule belongs "
                                          "in [axes] or [packages.NAME]; a rule here names "
                                          "exact values")
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
            problems: _Problems) -> tuple[tuple[PlannedCell, ...], tuple[Skipped, ...]]:
    """The cells: the lock's when it matches the matrix; else the product of each package's
    resolved axes, minus the excluded cells, plus the included ones. A cell of the product
    that cannot be built is skipped with its reason; an [[include]] that cannot is a problem
    (it names that one cell). A matrix with no cell but skipped ones reports their reasons."""
    cells: dict[Cell, PlannedCell] = {}
    skipped: dict[str, Skipped] = {}

    def plan_or_skip(cell: Cell, pkg: PackageSpec, **kw: Any) -> None:
        try:
            cells[cell] = plan_cell(cell, pkg, matrix, **kw)
        except ConfigError as exc:
            skipped[cell.id] = Skipped(package=cell.package, cell=cell.id, reason=exc.message)

    if matrix.lock is not None:
        for locked in matrix.lock.cells:
            plan_or_skip(locked_cell(locked), matrix.packages[locked.package],
                         manylinux=locked.manylinux, locked=locked)
        skipped.update((s.cell, Skipped(package=s.package, cell=s.cell, reason=s.reason))
                       for s in matrix.lock.skips)
        return _sorted(cells, skipped)
    for pkg in matrix.packages.values():
        combos: list[dict[str, Any] | Skipped] = []
        with problems.part():  # a rule that matches no release, a torch that is none
            for torch in pkg.axes["torch"]:
                if not torch_rule(str(torch), "torch").tracking:
                    matrix.facts.check_release(str(torch))
            combos = list(product(pkg, matrix.facts))
        for combo in combos:
            if isinstance(combo, Skipped):
                skipped[combo.cell] = combo
                continue
            if any(_rule_matches(r, pkg.name, combo["version"], combo) for r in excludes):
                continue
            plan_or_skip(Cell(package=pkg.name, **combo), pkg)
    for i, rule in enumerate(includes):
        with problems.part():
            pkg, cell = _included_cell(rule, f"[[include]] #{i + 1}", matrix.packages)
            cells[cell] = plan_cell(cell, pkg, matrix, manylinux=rule.get("manylinux"))
            skipped.pop(cell.id, None)
    if not cells and not problems.found:
        reasons = list(dict.fromkeys(s.reason for s in skipped.values()))
        if len(reasons) == 1:
            raise ConfigError(reasons[0])
        if reasons:
            raise ConfigErrors([ConfigError(r) for r in reasons])
        raise ConfigError("the matrix expands to no cells (everything excluded?)")
    return _sorted(cells, skipped)


def _sorted(cells: Mapping[Cell, PlannedCell], skipped: Mapping[str, Skipped]
            ) -> tuple[tuple[PlannedCell, ...], tuple[Skipped, ...]]:
    return (tuple(sorted(cells.values(), key=lambda p: p.cell.id)),
            tuple(sorted(skipped.values(), key=lambda s: s.cell)))


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
    values = {**AXIS_DEFAULTS, **parse_axes({a: rule[a] for a in AXES if a in rule}, where)}
    cell = Cell(
        package=pkg.name, version=version, torch=values["torch"][0], cuda=values["cuda"][0],
        archs=values["archs"][0], python=values["python"][0], platform=values["platform"][0],
    )
    return pkg, cell

