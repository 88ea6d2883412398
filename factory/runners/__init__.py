"""Runners: one Protocol, three ways to run a build (docker, the default; local; cibuildwheel)."""

from __future__ import annotations

from typing import Any

from factory.errors import UsageError
from factory.runners.base import INSIDE, BuildJob, Runner, RunResult

RUNNERS = ("docker", "local", "cibuildwheel")


def get_runner(name: str, **options: Any) -> Runner:
    """A runner by name; ``options`` go to its constructor (e.g. local: uncapped=True, mode=...)."""
    if name == "docker":
        from factory.runners.docker import DockerRunner

        return DockerRunner(**options)
    if name == "local":
        from factory.runners.local import LocalRunner

        return LocalRunner(**options)
    if name == "cibuildwheel":
        from factory.runners.cibuildwheel import CibuildwheelRunner

        return CibuildwheelRunner(**options)
    raise UsageError(f"unknown runner {name!r}; known: {', '.join(RUNNERS)}")


__all__ = ["INSIDE", "RUNNERS", "BuildJob", "RunResult", "Runner", "get_runner"]
