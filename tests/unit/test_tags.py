"""The local version scheme: round trip, distinctness, and the filename -> cell direction."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version
from tag_fixtures import cell_from_wheel_filename

from factory.errors import WheelError
from factory.matrix.cell import Cell
from factory.matrix.load import wheel_filename
from factory.matrix.tags import (
    VARIANT_RE,
    LocalTag,
    local_tag,
    parse_local,
    torch_pin,
    variant_of_filename,
)
from factory.recipes import get_recipe
from factory.upstream.facts import shipped_snapshot

FLASH = get_recipe("flash-attn")
GENERIC = get_recipe("torch-extension")
ARCHS = (80, 86, 89, 90, 100, 103, 120, 121)
ARCH_SETS = [s for n in (1, 2, 3) for s in itertools.combinations(ARCHS, n)] + [FLASH.default_archs]


def test_shape_follows_upstream_with_the_cuda_minor() -> None:
    assert (
        local_tag(cuda="13.0", torch_minor="2.14", archs=[100], default_archs=None)
        == "cu130torch2.14sm100"
    )
    assert (
        local_tag(cuda="12.8", torch_minor="2.10", archs=[90, 100], default_archs=None)
        == "cu128torch2.10sm90.100"
    )


def test_default_arch_set_gets_no_marker_and_reads_back_as_default() -> None:
    tag = local_tag(
        cuda="12.8", torch_minor="2.10", archs=[120, 80, 100, 90], default_archs=FLASH.default_archs
    )
    assert tag == "cu128torch2.10"
    assert parse_local(tag) == LocalTag(cuda="12.8", torch_minor="2.10", archs=None)


def test_archs_are_written_sorted_and_once() -> None:
    assert (
        local_tag(cuda="13.0", torch_minor="2.14", archs=[100, 90, 100], default_archs=None)
        == "cu130torch2.14sm90.100"
    )


@pytest.mark.parametrize("bad", ["cu130torch2.14sm100.90", "cu130torch2.14sm90.90"])
def test_non_canonical_arch_spelling_is_refused(bad: str) -> None:
    with pytest.raises(WheelError, match="sorted"):
        parse_local(bad)


def _all_combinations() -> list[tuple[str, str, tuple[int, ...]]]:
    """Every torch minor x CUDA build the shipped facts know, x the arch sets."""
    pairs = sorted({(f"{v.major}.{v.minor}", b.cuda)
                    for v in shipped_snapshot().torch_versions()
                    for b in shipped_snapshot().builds_of(str(v))})
    return [(minor, cuda, archs) for minor, cuda in pairs for archs in ARCH_SETS]


@pytest.mark.parametrize("default_archs", [None, FLASH.default_archs])
def test_round_trip_and_distinct_for_every_torch_cuda_archset(
    default_archs: tuple[int, ...] | None,
) -> None:
    seen: dict[str, tuple[str, str, tuple[int, ...]]] = {}
    for minor, cuda, archs in _all_combinations():
        tag = local_tag(cuda=cuda, torch_minor=minor, archs=archs, default_archs=default_archs)
        parsed = parse_local(tag)
        assert parsed.cuda == cuda and parsed.torch_minor == minor
        got_archs = parsed.archs if parsed.archs is not None else default_archs
        assert got_archs == archs
        # What packaging makes of it (normalisation) must still parse to the same values.
        assert parse_local(Version(f"1.0+{tag}").local or "") == parsed
        assert tag not in seen, f"{tag} names both {seen[tag]} and {(minor, cuda, archs)}"
        seen[tag] = (minor, cuda, archs)
    assert len(seen) == len(_all_combinations())


@given(
    cmaj=st.integers(10, 99),
    cmin=st.integers(0, 99),
    tmaj=st.integers(1, 9),
    tmin=st.integers(0, 40),
    archs=st.sets(st.sampled_from(ARCHS), min_size=1),
)
def test_round_trip_property(cmaj: int, cmin: int, tmaj: int, tmin: int, archs: set[int]) -> None:
    tag = local_tag(
        cuda=f"{cmaj}.{cmin}", torch_minor=f"{tmaj}.{tmin}", archs=archs, default_archs=None
    )
    assert parse_local(tag) == LocalTag(
        cuda=f"{cmaj}.{cmin}", torch_minor=f"{tmaj}.{tmin}", archs=tuple(sorted(archs))
    )


def test_cuda_minor_with_two_digits_stays_apart_from_one_digit() -> None:
    a = local_tag(cuda="12.1", torch_minor="2.5", archs=[90], default_archs=None)
    b = local_tag(cuda="12.10", torch_minor="2.5", archs=[90], default_archs=None)
    assert a != b
    assert parse_local(a).cuda == "12.1" and parse_local(b).cuda == "12.10"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cuda": "9.2", "torch_minor": "2.1", "archs": [70]}, "CUDA"),
        ({"cuda": "13.0", "torch_minor": "2.14.1", "archs": [100]}, "torch minor"),
        ({"cuda": "13.0", "torch_minor": "2.14", "archs": []}, "empty arch set"),
    ],
)
def test_local_tag_refuses_what_would_not_round_trip(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(WheelError, match=match):
        local_tag(default_archs=None, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        "cu12torch2.8",
        "cpu",
        "cu130torch2",
        "cu130torch2.14sm",
        "cu130torch2.14cxx11abiTRUE",
        "cu130torch2.14\n",
    ],
)
def test_parse_local_rejects_foreign_tags(bad: str) -> None:
    with pytest.raises(WheelError, match="not a factory tag"):
        parse_local(bad)


def test_torch_pin() -> None:
    assert torch_pin("2.14") == "torch==2.14.*"


@pytest.mark.parametrize("recipe", [FLASH, GENERIC])
def test_filename_to_cell_round_trip(recipe: object) -> None:
    for archs in [(100,), (90, 100), FLASH.default_archs]:
        cell = Cell(
            package="flash-attn",
            version="2.8.3.post2",
            torch="2.14.1",
            cuda="13.0",
            archs=archs,
            python="3.12",
        )
        local = local_tag(cuda=cell.cuda, torch_minor=cell.torch_minor, archs=cell.archs,
                          default_archs=recipe.default_archs)  # type: ignore[attr-defined]
        name = wheel_filename(cell, local, "manylinux_2_28_x86_64")
        back = cell_from_wheel_filename(name, recipe.default_archs, torch="2.14.1")  # type: ignore[attr-defined]
        assert back == cell
        default = recipe.default_archs is not None and archs == tuple(recipe.default_archs)  # type: ignore[attr-defined]
        marker = "" if default else "-sm" + ".".join(str(a) for a in archs)
        assert variant_of_filename(name) == "cu130-torch2.14" + marker


def test_the_variant_name_holds_the_arch_set_not_the_cpu() -> None:
    """One URL, one build per version and CPU: sm90 and sm100 builds never share a variant
    index; the x86_64 and aarch64 wheels of one build do (pip picks by platform tag)."""
    base = "flash_attn-2.8.3+cu130torch2.14{}-cp311-cp311-manylinux_2_28_{}.whl"
    for archs in ("sm90", "sm100", "sm90.100", ""):
        assert variant_of_filename(base.format(archs, "x86_64")) == variant_of_filename(
            base.format(archs, "aarch64"))
    names = {variant_of_filename(base.format(archs, "aarch64"))
             for archs in ("sm90", "sm100", "sm90.100", "")}
    assert names == {
        "cu130-torch2.14-sm90",
        "cu130-torch2.14-sm100",
        "cu130-torch2.14-sm90.100",
        "cu130-torch2.14",
    }
    assert all(VARIANT_RE.match(n) for n in names)
    assert not VARIANT_RE.match("files") and not VARIANT_RE.match("simple")


def test_filename_to_cell_without_full_torch_reads_patch_zero() -> None:
    name = "factory_example_ext-0.1.0+cu130torch2.14sm100-cp311-cp311-manylinux_2_36_x86_64.whl"
    cell = cell_from_wheel_filename(name)
    assert (cell.package, cell.version, cell.torch, cell.cuda, cell.archs, cell.python) == (
        "factory-example-ext",
        "0.1.0",
        "2.14.0",
        "13.0",
        (100,),
        "3.11",
    )


def test_filename_to_cell_refuses_a_torch_of_another_minor() -> None:
    name = "factory_example_ext-0.1.0+cu130torch2.14sm100-cp311-cp311-manylinux_2_36_x86_64.whl"
    with pytest.raises(WheelError, match="torch 2.14"):
        cell_from_wheel_filename(name, torch="2.13.0")


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl", "no local version"),
        ("flash_attn-2.8.3+cu130torch2.14-cp311-cp311-linux_x86_64.whl", "no default arch set"),
        ("flash_attn-2.8.3+cu130torch2.14sm100-py3-none-any.whl", "CPython"),
        ("not-a-wheel.zip", "invalid wheel filename"),
    ],
)
def test_filename_to_cell_errors(name: str, match: str) -> None:
    with pytest.raises(WheelError, match=match):
        cell_from_wheel_filename(name)


def test_untagged_or_foreign_filenames_have_no_variant() -> None:
    assert variant_of_filename("flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl") is None
    assert (
        variant_of_filename(
            "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"
        )
        is None
    )
