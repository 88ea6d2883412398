"""Choosing, for the doctor: filter the index's files step by step (Python, platform/glibc,
torch minor, torch's CUDA, driver, GPU arch) for one host and, when a step leaves nothing, word
the reason from what that step threw away. The chosen file becomes a ``Choice``: its
per-variant index URL and the exact requirement (``project==version+local``: PyPI cannot hold
a local version, so no resolver can take an upstream sdist or another build for it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from packaging.utils import canonicalize_name

from factory.hosts.index_reader import IndexFile, IndexReader
from factory.hosts.probe import (
    PYTHON_FROM_OPTION,
    HostInfo,
    driver_max_cuda,
    driver_runs_cuda,
    driver_table,
    version_tuple,
)
from factory.matrix.cell import sm_name, sm_names
from factory.matrix.gpus import runs_on
from factory.matrix.manylinux import glibc_text
from factory.matrix.tags import platform_tag_parts as _manylinux
from factory.recipes import default_archs_for


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    project: str
    wheel: str | None
    variant: str | None
    why: str | None  # why nothing fits
    warnings: tuple[str, ...] = ()
    index_url: str | None = None  # the per-variant index URL that holds the wheel
    requirement: str | None = None  # 'flash-attn==2.8.3+cu130torch2.14sm100': the exact build

    def as_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "fits": self.wheel is not None,
            "warnings": list(self.warnings),
        }


def _python_ok(f: IndexFile, py: str) -> bool:
    cp = "cp" + py.replace(".", "")
    interp_ok = bool(f.interpreters & {cp, "py3", "py" + py.replace(".", "")})
    abi_ok = bool(f.abis & {cp, "abi3", "none"})
    return interp_ok and abi_ok


def _platform_ok(f: IndexFile, host: HostInfo) -> bool:
    for tag in f.platforms:
        glibc, arch = _manylinux(tag)
        if arch == "any":
            return True
        if arch != host.machine:
            continue
        if glibc is None or (host.glibc is not None and glibc <= host.glibc):
            return True
    return False


def _needed_glibc(files: Iterable[IndexFile]) -> str:
    needs = set()
    for f in files:
        for tag in f.platforms:
            glibc, _ = _manylinux(tag)
            if glibc:
                needs.add(glibc)
    return glibc_text(min(needs)) if needs else "?"


def _arch_set(f: IndexFile, default_archs: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if f.local is not None and f.local.archs is not None:
        return f.local.archs
    return default_archs


def _archs_text(archs: tuple[int, ...]) -> str:
    return sm_names(archs, sep="+")


def _join(items: Sequence[str]) -> str:
    items = list(dict.fromkeys(items))
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _gpus_text(host: HostInfo) -> str:
    by_sm: dict[int, str] = {}
    for g in host.gpus:
        by_sm.setdefault(g.sm, g.name)
    parts = [f"{sm_name(sm)} ({name})" for sm, name in sorted(by_sm.items())]
    return ("the GPU is " if len(parts) == 1 else "the GPUs are ") + _join(parts)




def choose(host: HostInfo, project: str, files: Sequence[IndexFile], reader: IndexReader) -> Choice:
    """The wheel of ``project`` for this host: each step narrows the files or says why none
    fits."""
    project = canonicalize_name(project)
    warnings: list[str] = []
    fitting = list(files)
    for step in _STEPS:
        narrowed = step(host, project, fitting, warnings)
        if isinstance(narrowed, str):
            return Choice(project=project, wheel=None, variant=host.variant, why=narrowed,
                          warnings=tuple(warnings))
        fitting = narrowed
    return _pick(host, project, fitting, reader, warnings)


# A step of choose(): the files that still fit, or why none does; it may add warnings.
_Step = Callable[[HostInfo, str, list[IndexFile], list[str]], "list[IndexFile] | str"]


def _tagged(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    live = [f for f in files if f.yanked is None]
    if not files:
        return f"the index has no wheels of {project}"
    if not live:
        return f"every {project} wheel on the index is yanked"
    tagged = [f for f in live if f.local is not None]
    if not tagged:
        return (f"the index has no factory-tagged wheels of {project} "
                "(no +cuXYtorchA.B local version)")
    return tagged


def _for_python(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    step = [f for f in files if _python_ok(f, host.python)]
    if not step:
        have = sorted({i for f in files for i in f.interpreters})
        return f"Python is {host.python} but the index only has {project} for {_join(have)}"
    return step


def _for_platform(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    step = [f for f in files if _platform_ok(f, host)]
    above = [f for f in files if f not in step
             and any(_manylinux(t)[1] == host.machine for t in f.platforms)]
    if step and above:
        glibc = "unknown" if host.glibc is None else glibc_text(host.glibc)
        needs = sorted(
            {f"{f.variant or f.filename} (glibc >= {_needed_glibc([f])})" for f in above}
        )
        warnings.append(f"this host's glibc is {glibc}: {len(above)} {project} wheel(s) on the "
                        f"index need a newer one and cannot install here: {_join(needs)}")
    if not step:
        arches = {_manylinux(t)[1] for f in files for t in f.platforms}
        if host.machine not in arches:
            return (f"this host is {host.machine} but the index only has {project} for "
                    f"{_join(sorted(arches))}")
        glibc = "unknown" if host.glibc is None else glibc_text(host.glibc)
        return (f"this host's glibc is {glibc} but every {project} wheel for Python {host.python} "
                f"needs glibc >= {_needed_glibc(files)}")
    return step


def _for_torch(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    minors = sorted({f.local.torch_minor for f in files if f.local}, key=version_tuple)
    if host.torch is None:
        cause = host.torch_error or "torch is not installed"
        fix = ("install torch there first" if host.python_source == PYTHON_FROM_OPTION else
               "pass --python with the interpreter of the environment that has torch, or "
               "install torch there first")
        return (f"torch is not importable with {host.python_exe}, {host.python_source} "
                f"({cause}); {project} wheels are per torch minor (the index has torch "
                f"{_join(minors)}): {fix}")
    step = [f for f in files if f.local and f.local.torch_minor == host.torch_minor]
    if not step:
        return f"torch is {host.torch} but the index only has {project} for torch {_join(minors)}"
    return step


def _for_cuda(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    if not host.torch_cuda:
        return (f"torch {host.torch} is a CPU-only build (torch.version.cuda is None); "
                f"{project} needs a CUDA build of torch")
    want_cuda = _cuda_minor(host.torch_cuda)
    step = [f for f in files if f.cuda == want_cuda]
    if not step:
        cudas = sorted({f"cu{f.cuda.replace('.', '')}" for f in files if f.cuda},
                       key=version_tuple)
        return (f"torch {host.torch} is built with CUDA {want_cuda} but the index only has "
                f"{_join(cudas)} builds of {project} for torch {host.torch_minor}")
    return step


def _for_driver(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    if host.driver:
        want_cuda = _cuda_minor(host.torch_cuda or "")
        if not driver_runs_cuda(host.driver, want_cuda):
            top = driver_max_cuda(host.driver) or "none known"
            need = driver_table().get(f"{want_cuda.split('.')[0]}.0", "?")
            return (f"the NVIDIA driver {host.driver} supports CUDA up to {top} but torch and the "
                    f"{project} wheels for {host.variant} use CUDA {want_cuda} "
                    f"(driver >= {need} needed)")
    elif host.gpus:
        warnings.append("the driver version is unknown: not checked against CUDA")
    return files


def _for_gpus(
    host: HostInfo, project: str, files: list[IndexFile], warnings: list[str]
) -> list[IndexFile] | str:
    if not host.gpus:
        note = f" ({host.gpu_note})" if host.gpu_note else ""
        warnings.append(f"no NVIDIA GPU found{note}: chose by torch only; the wheel may lack "
                        "kernels for the GPU it will run on")
        return files
    default = default_archs_for(project)
    fits, unknown = [], []
    for f in files:
        archs = _arch_set(f, default)
        if archs is None:
            unknown.append(f)
        elif all(any(runs_on(a, sm) for a in archs) for sm in host.sms):
            fits.append(f)
    if not fits and unknown:
        warnings.append(
            f"{project}'s default arch set is unknown here: could not check the GPU arch")
        fits = unknown
    if not fits:
        known = {a for a in (_arch_set(f, default) for f in files) if a}
        sets = [_archs_text(a) for a in sorted(known)]
        return (f"{_gpus_text(host)} but the index only has {_join(sets)} builds of {project} "
                f"for {host.variant}")
    return fits


_STEPS: tuple[_Step, ...] = (
    _tagged, _for_python, _for_platform, _for_torch, _for_cuda, _for_driver, _for_gpus,
)


def _cuda_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _pick(host: HostInfo, project: str, fitting: list[IndexFile], reader: IndexReader,
          warnings: list[str]) -> Choice:
    """The best of the fitting files, on its own per-variant index, pinned exactly."""
    variant = host.variant
    assert variant is not None  # torch and its CUDA are known here
    default = default_archs_for(project)
    # Highest version first; among equals the widest arch set, which runs on the most GPUs.
    best = max(fitting, key=lambda f: (f.version, len(_arch_set(f, default) or ())))
    if not host.gpus:
        archs = _arch_set(best, default)
        if archs:
            warnings.append(f"{best.filename} holds kernels for {_archs_text(archs)} only")
    # The chosen file's own variant index holds one arch set (tags.py): the URL that fits this
    # host's GPU. The pin names the build exactly, so the line means one file on any index.
    variant = best.variant or variant
    if reader.files(project, variant) is None:
        warnings.append(
            f"the index has no per-variant page for {variant}; using the combined index"
        )
        url = reader.variant_url(None)
    else:
        url = reader.variant_url(variant)
    return Choice(
        project=project, wheel=best.filename, variant=variant, why=None,
        warnings=tuple(warnings), index_url=url, requirement=f"{project}=={best.version}",
    )
