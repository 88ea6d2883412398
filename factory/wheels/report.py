"""What verification says about a wheel: one ``Check`` per thing checked (pass, fail or skipped,
with a one-line detail) and the ``WheelReport`` that collects them."""

from __future__ import annotations

import dataclasses
from typing import Any

from factory.wheels.floor import BinaryFloor


@dataclasses.dataclass(frozen=True, kw_only=True)
class Check:
    # 'archs', 'filename', 'metadata', 'local-tag', 'torch-pin', 'platform', 'record', 'cpu',
    # 'glibc',
    # 'import'
    name: str
    ok: bool  # a skipped check is ok (it found nothing wrong) and says why it was skipped
    detail: str
    skipped: bool = False

    @property
    def status(self) -> str:
        return "skip" if self.skipped else ("pass" if self.ok else "fail")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "ok": self.ok, "detail": self.detail}


@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelReport:
    wheel: str  # the filename
    checks: tuple[Check, ...]
    floor: BinaryFloor | None = None  # what the binaries need from the host's glibc

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def summary(self) -> str:
        bad = self.failures
        if not bad:
            return f"{self.wheel}: verified ({len(self.checks)} checks)"
        return f"{self.wheel}: {bad[0].name}: {bad[0].detail}" + (
            f" (and {len(bad) - 1} more failed check(s))" if len(bad) > 1 else ""
        )

    def as_dict(self) -> dict[str, Any]:
        return {"wheel": self.wheel, "ok": self.ok, "checks": [c.as_dict() for c in self.checks],
                "floor": self.floor.as_dict() if self.floor else None}
