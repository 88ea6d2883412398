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
               cross_compiles=True, image_toolkit=True, host_glibc=False),
    RunnerKind(name="local", target="factory.runners.local:LocalRunner",
               cross_compiles=True, image_toolkit=False, host_glibc=True,
               options=("mode", "uncapped", "interpreter")),
    RunnerKind(name="cibuildwheel", target="factory.runners.cibuildwheel:CibuildwheelRunner",
               cross_compiles=False, image_toolkit=False, host_glibc=False),
)}


def runner_kind(name: str) -> RunnerKind:
    """The kind called ``name``; one line naming the known ones otherwise."""
    kind = RUNNERS.get(name)
    if kind is None:
        raise UsageError(f"unknown runner {name!r}; known: {', '.join(RUNNERS)}")
    return kind


def runner_flags(able: Callable[[RunnerKind], bool]) -> str:
    """'--runner docker or --runner local': the kinds ``able`` picks, for a TIP."""
    return " or ".join(f"--runner {k.name}" for k in RUNNERS.values() if able(k))


def get_runner(name: str, **options: Any) -> Runner:
    """A runner by name; ``options`` go to its constructor (e.g. local: uncapped=True, mode=...)."""
    return runner_kind(name).load()(**options)


__all__ = [
    "INSIDE", "RUNNERS", "BuildJob", "RunResult", "Runner", "RunnerKind", "get_runner",
    "runner_flags", "runner_kind",
]
