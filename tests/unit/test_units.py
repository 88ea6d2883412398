"""Sizes: one parser and one formatter, binary units (docker's "16g" is 16 GiB)."""

from __future__ import annotations

import pytest

from factory.errors import UsageError
from factory.units import GIB, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16g", 16 * GIB),
        ("16G", 16 * GIB),
        ("512M", 512 * 1024**2),
        ("2GiB", 2 * GIB),
        ("2gb", 2 * GIB),
        ("1.5g", int(1.5 * GIB)),
        ("1t", 1024**4),
        ("1073741824", GIB),
        (" 8 g ", 8 * GIB),
        (4096, 4096),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "g", "16x", "-1g", "0", "sixteen", "1.2.3g"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_size(text)


def test_format_size_round_trips_binary_units() -> None:
    assert format_size(16 * GIB) == "16.0 GiB"
    assert format_size(parse_size("512M")) == "512.0 MiB"


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (3 * 1024**4, "3.0 TiB"),
        (-2 * GIB, "-2.0 GiB"),
    ],
)
def test_format_size_picks_the_largest_unit(n: int, text: str) -> None:
    assert format_size(n) == text


def test_parse_size_names_what_it_parses() -> None:
    with pytest.raises(UsageError, match="unparseable compile cache size 'x'"):
        parse_size("x", what="compile cache size")
