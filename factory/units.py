"""Sizes in bytes: one parser and one formatter, binary units throughout; and durations in
the one short spelling progress lines use (``format_duration``).

Sizes use binary multiples like docker's --memory does ("16g" is 16 GiB), so a size passed to
`factory plan` means the same as the same size passed to the container, and a compile cache
bound of "20G" is what sccache reads as 20 GiB.
"""

from __future__ import annotations

import re

from factory.errors import UsageError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": KIB, "m": MIB, "g": GIB, "t": TIB}


def parse_size(text: str | int, *, what: str = "memory size") -> int:
    """'16g', '512M', '2GiB', '1.5g', '1073741824' -> bytes (binary units, like docker).

    ``what`` names the size in the one-line error (UsageError; callers reading a config file
    re-raise it as a ConfigError naming the key)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise UsageError(f"{what} must be positive, not {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(
            f"unparseable {what} {text!r}: use a number with k, m, g or t (e.g. '16g', '512M')"
        )
    try:
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    except OverflowError:  # more digits than a float holds: infinity
        raise UsageError(f"{what} {str(text)[:80]!r} is out of range") from None
    if value <= 0:
        raise UsageError(f"{what} {text!r} must be positive")
    return value


def format_size(n: int | float) -> str:
    """Bytes -> '16.0 GiB', '512.0 MiB', '1.5 KiB', '12 B' (binary, matching parse_size)."""
    value = float(n)
    for unit, scale in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{int(value)} B"


def format_duration(seconds: float) -> str:
    """42 s -> '42s', 342 s -> '5m42s', 5400 s -> '1h30m'."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
