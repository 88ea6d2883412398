"""GPU product names and the sm each one needs (factory/data/gpus.toml): 'B200' is sm_100,
'RTX PRO 6000' is sm_120. The finder page maps what people type to the arch of a build, and
says which products a build's archs run on."""

from __future__ import annotations

import functools
import importlib.resources
import re

from factory.matrix.cell import parse_arch
from factory.tomlread import tomllib


@functools.cache
def gpu_sms() -> dict[str, int]:
    """Product name -> sm (100 for 'B200'), in the table's order."""
    text = importlib.resources.files("factory.data").joinpath("gpus.toml").read_text()
    return {name: parse_arch(cc) for name, cc in tomllib.loads(text)["gpus"].items()}


def runs_on(built: int, gpu: int) -> bool:
    """SASS for sm_``built`` runs on an sm_``gpu`` GPU: the same major, a minor at least as
    high (FIELD-NOTES s.10): sm_80 code runs on sm_86, sm_100 code not on sm_120."""
    return built // 10 == gpu // 10 and gpu >= built


def normalized(name: str) -> str:
    """'RTX PRO 6000' / 'rtx-pro-6000' / 'rtxpro6000' -> 'rtxpro6000' (how people type it)."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def sm_of(name: str) -> int | None:
    """The sm of a product name as people type it; None when it names none."""
    key = normalized(name)
    return next((sm for product, sm in gpu_sms().items() if normalized(product) == key), None)
