"""What a recipe is: how one package takes its build knobs, and its known fixes, as data.

A recipe is one TOML table (a shipped ``factory/recipes/NAME.toml`` or a matrix's
``[recipes.NAME]``) read into a frozen :class:`Recipe`. Its methods are the whole interface the
pipeline uses: ``env()`` (the variables a cell's build gets), ``fixes_for()``, ``check_cell()``
and ``compilers()`` (what the factory's compiler wrappers do to every nvcc and C++ call). Nothing
package-specific is Python: what a package needs is in its table.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from factory.errors import BuildError, CellError, ConfigError
from factory.matrix.cell import Cell, parse_arch, sm_names
from factory.matrix.settings import check_keys

# The C++ standard torch's own headers need, by torch version: torch >= 2.13 headers stop with
# #error below C++20 (std::strong_ordering in c10/util/intrusive_ptr.h). One rule for every
# package: the compiler wrappers raise whatever -std= a package pins (factory/runners/inside).
TORCH_CXX_STANDARDS: tuple[tuple[str, int], ...] = ((">=2.13", 20),)

RECIPE_KEYS = {
    "revision", "about", "build-requires", "default-archs", "supported-archs", "package-archs",
    "memory-model", "knobs", "env", "fixes", "smoke-test", "check-build-requires",
}
PACKAGE_ARCH_KEYS = {"cuda", "archs"}
KNOB_KEYS = {"archs", "arch-format", "arch-separator", "force-build", "skip-cuda-build",
             "local-version", "nvcc-threads"}
FIX_KEYS = {"reason", "file", "replace", "with", "when"}
WHEN_KEYS = ("torch", "cuda", "version")
SMOKE_KEYS = {"import", "with-dependencies"}
_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def cxx_standard(torch: str) -> int | None:
    """The C++ standard a cell of this torch must compile with (None: whatever it pins)."""
    for spec, std in TORCH_CXX_STANDARDS:
        if Version(torch) in SpecifierSet(spec):
            return std
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceFix:
    """A textual fix applied to the (copied) source tree when ``when`` matches the cell.

    ``when`` is a dict of specifiers keyed by 'torch', 'cuda' or 'version'.
    """

    reason: str
    file: str
    replace: str
    with_: str
    when: dict[str, str]

    def applies(self, cell: Cell) -> bool:
        values = {"torch": cell.torch, "cuda": cell.cuda, "version": cell.version}
        return all(Version(values[k]) in SpecifierSet(spec) for k, spec in self.when.items())

    def apply(self, tree: Path) -> bool:
        """Apply to ``tree``; True if the file changed. A fix whose text is missing is an error."""
        path = tree / self.file
        text = path.read_text()
        if self.with_ in text and self.replace not in text:
            return False  # already applied (resumed build directory)
        if self.replace not in text:
            raise BuildError(
                f"recipe fix '{self.reason}' found no {self.replace!r} in {self.file}: "
                "the recipe needs updating for this source"
            )
        path.write_text(text.replace(self.replace, self.with_))
        return True


@dataclasses.dataclass(frozen=True, kw_only=True)
class Knobs:
    """The package's own build variables (None: it has no such variable)."""

    archs: str | None = None  # its arch variable (torch's TORCH_CUDA_ARCH_LIST is always set)
    arch_format: str = "{major}.{minor}"  # one arch in that variable: '{major}{minor}' -> 90
    arch_separator: str = ";"
    force_build: tuple[str, str] | None = None  # (VAR, VALUE): never download a prebuilt wheel
    skip_cuda_build: tuple[str, str] | None = None  # (VAR, VALUE that does NOT skip)
    local_version: str | None = None  # gets the local version tag ('cu130torch2.14sm100')
    nvcc_threads: str | None = None  # passed on as nvcc --threads


@dataclasses.dataclass(frozen=True, kw_only=True)
class SmokeTest:
    """The clean-venv import check: which modules, and whether the wheel's own runtime
    dependencies are installed (from the offline wheelhouse) first."""

    imports: tuple[str, ...] = ()  # empty: every top-level module of the wheel
    with_dependencies: bool = True  # False: the wheel and its torch pin only


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    revision: str  # bump when the recipe changes what it produces; part of the content key
    default_archs: tuple[int, ...] | None  # what the package builds when told nothing
    supported_archs: frozenset[int] | None  # None: whatever nvcc supports
    # the -gencode list the package's own build hard-codes, by the CUDA it is built with:
    # (a CUDA specifier, '' for any; archs), every matching entry adds its archs
    package_arch_ranges: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    build_requires: tuple[str, ...]  # installed from the wheelhouse next to torch
    fixes: tuple[SourceFix, ...] = ()
    # Upstream memory figures are per nvcc thread per arch; the planner reads this name.
    memory_model_key: str = ""
    knobs: Knobs = Knobs()
    env_vars: Mapping[str, str] = dataclasses.field(default_factory=dict)  # fixed variables
    smoke: SmokeTest = SmokeTest()
    # the build frontend checks the sdist's [build-system] requires against the venv; off for a
    # package that pins what the cell decides (grouped-gemm asks for torch<2.8)
    check_build_requires: bool = True
    about: str = ""
    origin: str = ""  # where it was declared: 'shipped' or the matrix file

    def package_archs(self, cuda: str) -> tuple[int, ...] | None:
        """The archs the package's own build asks nvcc for with this CUDA (None: unknown)."""
        if self.package_arch_ranges is None:
            return None
        found = {a for spec, archs in self.package_arch_ranges
                 if Version(cuda) in SpecifierSet(spec) for a in archs}
        return tuple(sorted(found))

    def _arch_variable(self, cell: Cell) -> str:
        """The cell's archs as the package's own arch variable spells them."""
        k = self.knobs
        return k.arch_separator.join(
            k.arch_format.format(major=a // 10, minor=a % 10, sm=a) for a in cell.archs)

    def supports_threads(self) -> bool:
        """True when the package passes NVCC_THREADS (its variable) through to nvcc --threads."""
        return self.knobs.nvcc_threads is not None

    def env(
        self, cell: Cell, *, max_jobs: int, nvcc_threads: int, local_version: str
    ) -> dict[str, str]:
        """The build's variables: torch's arch list (torch needs one when no GPU is visible,
        and exactly the cell's archs, no '+PTX', for packages that honour it), MAX_JOBS (torch's
        ninja), the package's own knobs and fixed variables."""
        k = self.knobs
        env = {"TORCH_CUDA_ARCH_LIST": cell.arch_list, "MAX_JOBS": str(max_jobs)}
        if k.archs:
            env[k.archs] = self._arch_variable(cell)
        if k.nvcc_threads:
            env[k.nvcc_threads] = str(nvcc_threads)
        for pair in (k.force_build, k.skip_cuda_build):
            if pair:
                env[pair[0]] = pair[1]
        if k.local_version:
            env[k.local_version] = local_version
        env.update(self.env_vars)
        return env

    def fixes_for(self, cell: Cell) -> list[SourceFix]:
        return [f for f in self.fixes if f.applies(cell)]

    def check_cell(self, cell: Cell) -> None:
        """Raise ConfigError when the recipe cannot build the cell."""
        if self.supported_archs is not None:
            bad = [a for a in cell.archs if a not in self.supported_archs]
            if bad:
                raise ConfigError(
                    f"{cell.package} cannot build arch(s) {sm_names(bad)}; "
                    f"it supports {sm_names(sorted(self.supported_archs))}"
                )

    def compilers(self, cell: Cell) -> dict[str, Any]:
        """What the factory's compiler wrappers do in this cell's build: nvcc compiles exactly
        the cell's archs (targets outside them dropped, a compile left with none refused) and,
        where torch needs it, host and device code use its C++ standard."""
        return {"archs": list(cell.archs), "cxx_std": cxx_standard(cell.torch),
                "package_archs": list(self.package_archs(cell.cuda) or ())}

    def describe(self, cell: Cell) -> list[str]:
        """Every flag and fix the build of ``cell`` gets, one line each (the dry run's)."""
        sm = sm_names(cell.archs)
        lines = [f"nvcc compiles {sm} only: any -gencode/-arch/--generate-code target outside it "
                 "is dropped, a compile left with none of them fails"]
        lines.append(self._own_list(cell))
        std = cxx_standard(cell.torch)
        if std:
            lines.append(f"C++{std} for host and device code (torch {cell.torch} headers need it): "
                         f"a pinned -std=c++14/17 becomes -std=c++{std}, nvcc gets -std=c++{std} "
                         "when the package gives none")
        lines += [f"source fix: {f.reason} ({f.file})" for f in self.fixes_for(cell)]
        return lines

    def _own_list(self, cell: Cell) -> str:
        """What becomes of the package's own arch list in this cell (the dry run's line)."""
        sm = sm_names(cell.archs)
        if self.knobs.archs:
            return (f"{self.name} builds the archs of {self.knobs.archs}, set to the cell's: "
                    f"{self.knobs.archs}={self._arch_variable(cell)}")
        own = self.package_archs(cell.cuda)
        if own is None:
            return f"the package's own list is unknown; nvcc will compile only {sm}"
        what = f"{self.name}'s own arch list with CUDA {cell.cuda}"
        if not own:
            return f"{what} is empty; nvcc will compile only {sm}"
        if set(own) == set(cell.archs):
            return f"{what} is the cell's ({sm}): nothing is dropped"
        return f"{what} ({sm_names(own)}) is narrowed to {sm}"

    @classmethod
    def from_table(cls, name: str, table: Any, *, where: str, origin: str) -> Recipe:
        """One recipe table (a shipped file or ``[recipes.NAME]``); one-line errors."""
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table")
        check_keys(table, RECIPE_KEYS, where)
        revision = table.get("revision")
        if not isinstance(revision, (str, int)) or isinstance(revision, bool) or revision == "":
            raise ConfigError(f"{where} needs revision = \"1\" (bump it when what it builds "
                              "changes: it is part of every cell's content key)")
        smoke = _smoke(table.get("smoke-test", {}), f"{where}.smoke-test")
        check = table.get("check-build-requires", True)
        if not isinstance(check, bool):
            raise ConfigError(f"{where} check-build-requires must be true or false")
        about = table.get("about", "")
        if not isinstance(about, str):
            raise ConfigError(f"{where} about must be a string")
        model = table.get("memory-model", "")
        if not isinstance(model, str):
            raise ConfigError(f"{where} memory-model must be a recipe name")
        return cls(
            name=name, revision=str(revision), about=about, origin=origin,
            default_archs=_archs(table, "default-archs", where),
            supported_archs=(None if (s := _archs(table, "supported-archs", where)) is None
                             else frozenset(s)),
            package_arch_ranges=_package_archs(table, where),
            build_requires=tuple(_strings(table.get("build-requires", []),
                                          f"{where} build-requires")),
            fixes=tuple(_fix(f, f"{where} fixes #{i + 1}")
                        for i, f in enumerate(_tables(table.get("fixes", []), f"{where} fixes"))),
            memory_model_key=model or name,
            knobs=_knobs(table.get("knobs", {}), f"{where}.knobs"),
            env_vars=_env(table.get("env", {}), f"{where}.env"),
            smoke=smoke, check_build_requires=check,
        )


# -- reading a table ----------------------------------------------------------------------------
def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return value


def _tables(value: Any, where: str, example: str = "[[...fixes]]") -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{where} must be an array of tables ({example})")
    return value


def _archs(table: Mapping[str, Any], key: str, where: str) -> tuple[int, ...] | None:
    if key not in table:
        return None
    try:
        archs = tuple(sorted({parse_arch(a) for a in _strings(table[key], f"{where} {key}")}))
    except CellError as exc:
        raise ConfigError(f"{where} {key}: {exc.message}") from None
    if not archs:
        raise ConfigError(f"{where} {key} is an empty list")
    return archs


def _package_archs(table: Mapping[str, Any],
                   where: str) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """``package-archs = [{ cuda = ">=12.8", archs = ["10.0"] }, ...]``."""
    if "package-archs" not in table:
        return None
    entries = _tables(table["package-archs"], f"{where} package-archs",
                      example='[{ cuda = ">=12.8", archs = ["10.0", "12.0"] }]')
    out = []
    for i, entry in enumerate(entries):
        at = f"{where} package-archs #{i + 1}"
        check_keys(entry, PACKAGE_ARCH_KEYS, at)
        spec = entry.get("cuda", "")
        try:
            SpecifierSet(spec if isinstance(spec, str) else "!")
        except InvalidSpecifier:
            raise ConfigError(f"{at} cuda: {spec!r} is not a version specifier") from None
        archs = _archs(entry, "archs", at)
        if archs is None:
            raise ConfigError(f"{at} needs archs = [\"9.0\", ...]")
        out.append((spec, archs))
    return tuple(out)


def _var(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _VAR_RE.match(value):
        raise ConfigError(f"{where} must be an environment variable name, not {value!r}")
    return value


def _assignment(value: Any, where: str) -> tuple[str, str]:
    """'VAR=VALUE' -> (VAR, VALUE)."""
    if not isinstance(value, str) or "=" not in value:
        raise ConfigError(f"{where} must be 'VARIABLE=VALUE', not {value!r}")
    var, _, val = value.partition("=")
    return _var(var, where), val


def _knobs(raw: Any, where: str) -> Knobs:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{where}] must be a table")
    check_keys(raw, KNOB_KEYS, f"[{where}]")
    fmt = raw.get("arch-format", "{major}.{minor}")
    try:
        sample = fmt.format(major=9, minor=0, sm=90) if isinstance(fmt, str) else None
    except (KeyError, IndexError, ValueError):
        sample = None
    if not sample:
        raise ConfigError(f"{where} arch-format must use {{major}}, {{minor}} or {{sm}}, "
                          f"like '{{major}}{{minor}}', not {fmt!r}")
    sep = raw.get("arch-separator", ";")
    if not isinstance(sep, str) or not sep:
        raise ConfigError(f"{where} arch-separator must be a string like ';'")
    return Knobs(
        archs=_var(raw["archs"], f"{where} archs") if "archs" in raw else None,
        arch_format=fmt, arch_separator=sep,
        force_build=(_assignment(raw["force-build"], f"{where} force-build")
                     if "force-build" in raw else None),
        skip_cuda_build=(_assignment(raw["skip-cuda-build"], f"{where} skip-cuda-build")
                         if "skip-cuda-build" in raw else None),
        local_version=(_var(raw["local-version"], f"{where} local-version")
                       if "local-version" in raw else None),
        nvcc_threads=(_var(raw["nvcc-threads"], f"{where} nvcc-threads")
                      if "nvcc-threads" in raw else None),
    )


def _env(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{where}] must be a table of VARIABLE = \"value\"")
    for k, v in raw.items():
        _var(k, f"[{where}]")
        if not isinstance(v, str):
            raise ConfigError(f"[{where}] {k} must be a string")
    return dict(raw)


def _fix(raw: dict[str, Any], where: str) -> SourceFix:
    check_keys(raw, FIX_KEYS, where)
    for key in ("reason", "file", "replace", "with"):
        if not isinstance(raw.get(key), str) or (key != "with" and not raw[key]):
            raise ConfigError(f"{where} needs {key} = \"...\"")
    when = raw.get("when", {})
    if not isinstance(when, dict):
        raise ConfigError(f"{where} when must be a table like {{ torch = \">=2.14\" }}")
    check_keys(when, WHEN_KEYS, f"{where} when")
    for k, spec in when.items():
        try:
            SpecifierSet(str(spec))
        except InvalidSpecifier:
            raise ConfigError(f"{where} when.{k}: {spec!r} is not a version specifier") from None
    file = raw["file"]
    if Path(file).is_absolute() or ".." in Path(file).parts:
        raise ConfigError(f"{where} file must be a path inside the source tree, not {file!r}")
    return SourceFix(reason=raw["reason"], file=file, replace=raw["replace"], with_=raw["with"],
                     when={k: str(v) for k, v in when.items()})


def _smoke(raw: Any, where: str) -> SmokeTest:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{where}] must be a table")
    check_keys(raw, SMOKE_KEYS, f"[{where}]")
    imports = _strings(raw.get("import", []), f"{where} import")
    bad = [m for m in imports if not _MODULE_RE.match(m)]
    if bad:
        raise ConfigError(f"{where} import: {bad[0]!r} is not a module name")
    deps = raw.get("with-dependencies", True)
    if not isinstance(deps, bool):
        raise ConfigError(f"{where} with-dependencies must be true or false")
    if not deps and not imports:
        raise ConfigError(f"{where}: with-dependencies = false needs import = [...] (the "
                          "modules that load without the package's other dependencies)")
    return SmokeTest(imports=tuple(imports), with_dependencies=deps)


__all__ = ["Knobs", "Recipe", "SmokeTest", "SourceFix", "cxx_standard"]
