"""The builders a schedule assigns work to: one ``[[builder]]`` table each (name, memory, CPUs,
platform, labels), as .github/builders.toml lists the self-hosted runners."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.matrix.tags import wheel_platform
from factory.tomlread import tomllib
from factory.toolchain.cross import can_build
from factory.units import parse_size


@dataclasses.dataclass(frozen=True, kw_only=True)
class Builder:
    name: str
    memory_bytes: int
    cpus: int
    platform: str  # machine, e.g. "x86_64": builds the cells whose wheel tag ends with it
    labels: tuple[str, ...] = ()

    def builds(self, plat: str) -> bool:
        """Cells for its own CPU, and the ones it cross-builds (factory.toolchain.cross)."""
        return can_build(builder=self.platform, target=_machine(plat))


@functools.cache
def _machine(plat: str) -> str:
    """The CPU a wheel's platform tag names, parsed once per tag: the search asks per move."""
    return wheel_platform([plat])


def load_builders(path: Path) -> tuple[Builder, ...]:
    """A TOML file of ``[[builder]]`` tables: name, memory ("256g"), cpus, platform, labels."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read builders file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"builders file {path} is not valid TOML: {exc}") from None
    return builders_from(doc.get("builder", []), where=str(path))


def builders_from(tables: Iterable[Mapping[str, Any]], *, where: str = "builders") -> tuple[
        Builder, ...]:
    out: list[Builder] = []
    known = {"name", "memory", "cpus", "platform", "labels"}
    for i, t in enumerate(tables):
        extra = set(t) - known
        if extra:
            raise ConfigError(f"{where}: builder {i + 1} has unknown key(s) {sorted(extra)}")
        try:
            b = Builder(name=str(t["name"]), memory_bytes=parse_size(str(t["memory"])),
                        cpus=int(t["cpus"]), platform=str(t.get("platform", "x86_64")),
                        labels=tuple(str(x) for x in t.get("labels", ())))
        except KeyError as exc:
            raise ConfigError(f"{where}: builder {i + 1} lacks {exc}") from None
        if b.cpus < 1 or b.memory_bytes < 1:
            raise ConfigError(f"{where}: builder {b.name} needs memory and cpus above 0")
        out.append(b)
    if not out:
        raise ConfigError(f"{where}: no [[builder]] tables")
    if len({b.name for b in out}) != len(out):
        raise ConfigError(f"{where}: builder names must be unique")
    return tuple(out)
