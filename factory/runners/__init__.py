"""Runners: one Protocol (``base.Runner``), one module per way to run a build, and the registry of
their kinds below.

A kind is data: its name, what it can do and where its class is. The matrix reads it without
importing any runner (it checks ``[settings] runner`` and, for an "auto" glibc floor, tags the
wheel for the glibc the kind links against); the class is imported when a build asks for one.
A new runner is its module plus one line in ``RUNNERS``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any, cast

from factory.errors import UsageError
from factory.runners.base import INSIDE, BuildJob, Runner, RunResult


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerKind:
    name: str
    target: str  # "module:Class", imported by load()
    where: str  # where its builds run, for --runner's help
    cross_compiles: bool  # builds an aarch64 cell on an x86_64 builder (the cross image)
    # builds in the matrix's builder image as it is: its python<X.Y> and, for CUDA 12.x, the
    # toolkit stacked on it ('factory image cuda')
    image_toolkit: bool
    host_glibc: bool  # links against this host's glibc: an "auto" floor is this host's
    options: tuple[str, ...] = ()  # the keyword options its class takes (build --python-env ...)

    def load(self) -> type[Runner]:
        module, _, name = self.target.partition(":")
        return cast("type[Runner]", getattr(importlib.import_module(module), name))


RUNNERS: dict[str, RunnerKind] = {kind.name: kind for kind in (
    RunnerKind(name="docker", target="factory.runners.docker:DockerRunner",
               where="a docker container", cross_compiles=True, image_toolkit=True,
               host_glibc=False),
    RunnerKind(name="local", target="factory.runners.local:LocalRunner",
               where="a cgroup on this host", cross_compiles=True, image_toolkit=False,
               host_glibc=True, options=("mode", "uncapped", "interpreter")),
    RunnerKind(name="cibuildwheel", target="factory.runners.cibuildwheel:CibuildwheelRunner",
               where="cibuildwheel's containers", cross_compiles=False, image_toolkit=False,
               host_glibc=False),
)}
DEFAULT_RUNNER = "docker"  # [settings] runner unless the matrix names one
# What an engine's job builds with: a cgroup inside its allocation (a Slurm job, a pod), where
# no container engine runs.
ENGINE_RUNNER = "local"


def runner_kind(name: str) -> RunnerKind:
    """The kind called ``name``; one line naming the known ones otherwise."""
    kind = RUNNERS.get(name)
    if kind is None:
        raise UsageError(f"unknown runner {name!r}; known: {', '.join(RUNNERS)}")
    return kind


def runner_help() -> str:
    """--runner's help: every kind and where it builds."""
    kinds = [f"{k.name} ({k.where})" for k in RUNNERS.values()]
    return (f"where the build runs: {', '.join(kinds[:-1])} or {kinds[-1]} (default: the "
            "matrix's settings.runner)")


def kinds_taking(*options: str) -> str:
    """'local': the kinds whose class takes all of ``options`` (for a help text or an error)."""
    return " and ".join(k.name for k in RUNNERS.values() if set(options) <= set(k.options))


def runner_flags(able: Callable[[RunnerKind], bool]) -> str:
    """'--runner docker or --runner local': the kinds ``able`` picks, for a TIP."""
    return " or ".join(f"--runner {k.name}" for k in RUNNERS.values() if able(k))


def get_runner(name: str, **options: Any) -> Runner:
    """A runner by name; ``options`` go to its constructor (e.g. local: uncapped=True, mode=...)."""
    return runner_kind(name).load()(**options)


__all__ = [
    "DEFAULT_RUNNER", "ENGINE_RUNNER", "INSIDE", "RUNNERS", "BuildJob", "RunResult", "Runner",
    "RunnerKind", "get_runner", "kinds_taking", "runner_flags", "runner_help", "runner_kind",
]
