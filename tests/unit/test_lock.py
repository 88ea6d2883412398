"""Tracking rules in matrix.toml and the lock they resolve into (``factory lock``): the rules
resolve as documented (against the shipped snapshot: recorded index answers), cells known not
to build are data with a reason, the lock is what builds read, ``--check`` is one table and
exit 1, and a refresh that finds nothing new leaves the lock byte for byte as it was."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from index_wheels import make_wheel
from pypi_standin import StandIn

from factory.cli import main
from factory.errors import CellError, ConfigError, UsageError
from factory.matrix.load import load_matrix
from factory.matrix.lock import (
    Lock,
    LockedCell,
    LockedSkip,
    UsedFact,
    change_summary,
    changes,
    loads,
    lock_path,
    read_lock,
)
from factory.matrix.rules import (
    cuda_rule,
    python_range,
    python_rule,
    resolve_cuda,
    resolve_python,
    resolve_torch,
    resolve_versions,
    torch_rule,
    version_rule,
)
from factory.upstream.facts import Origin, shipped_snapshot

FA = "d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b"


def matrix_text(*, torch: str = '["latest:2"]', cuda: str = '["default"]',
                archs: str = '[["10.0"]]', python: str = '["torch"]',
                python_range_line: str = 'python-range = "==3.12.*"',
                platform: str = '["x86_64", "aarch64"]', versions: str = '["latest"]',
                settings: str = "") -> str:
    return f"""\
version = 1
[settings]
{settings}
[axes]
torch = {torch}
cuda = {cuda}
archs = {archs}
python = {python}
{python_range_line}
platform = {platform}

[packages.flash-attn]
recipe = "flash-attn"
versions = {versions}
"""


def _ids(text: str) -> list[str]:
    return [pc.cell.id for pc in load_matrix(text=text).cells]


# -- the rules ------------------------------------------------------------------------------------
def test_torch_rules() -> None:
    facts = shipped_snapshot()
    rules = lambda *texts: [torch_rule(t, "torch") for t in texts]  # noqa: E731
    assert resolve_torch(rules("latest:2"), facts) == ["2.15.0", "2.14.1"]
    assert resolve_torch(rules("latest"), facts) == ["2.15.0"]
    assert resolve_torch(rules(">=2.12"), facts) == ["2.15.0", "2.14.1", "2.13.0", "2.12.1"]
    assert resolve_torch(rules(">=2.12,<2.14"), facts) == ["2.13.0", "2.12.1"]
    assert resolve_torch(rules("latest", "2.10.0", "2.15.0"), facts) == ["2.15.0", "2.10.0"]
    with pytest.raises(ConfigError, match="matches no release"):
        resolve_torch(rules(">=3"), facts)
    with pytest.raises(ConfigError, match="asks for no version"):
        torch_rule("latest:0", "torch")
    with pytest.raises(ConfigError, match="not a version specifier"):
        torch_rule(">=two", "torch")


def test_package_version_rules() -> None:
    releases = shipped_snapshot().packages["flash-attn"]
    rule = lambda t: [version_rule(t, "versions", "flash-attn")]  # noqa: E731
    assert resolve_versions(rule("latest"), "flash-attn", releases) == ["2.8.3.post2"]
    assert resolve_versions(rule("latest:2"), "flash-attn", releases) == [
        "2.8.3.post2", "2.8.3.post1"]
    assert resolve_versions(rule(">=2.8.3"), "flash-attn", releases) == [
        "2.8.3.post2", "2.8.3.post1", "2.8.3"]
    assert resolve_versions(rule("2.5.0"), "flash-attn", None) == ["2.5.0"]  # exact: as written
    with pytest.raises(ConfigError, match="needs flash-attn's releases"):
        resolve_versions(rule("latest"), "flash-attn", None)


def test_cuda_and_python_rules() -> None:
    facts = shipped_snapshot()
    rule = lambda t: [cuda_rule(t, "cuda")]  # noqa: E731
    assert resolve_cuda(rule("default"), facts, torch="2.15.0", platform="x86_64") == (
        ["13.2"], [])
    assert resolve_cuda(rule("default"), facts, torch="2.14.1", platform="aarch64") == (
        ["13.0"], [])
    assert resolve_cuda(rule("all"), facts, torch="2.14.1", platform="x86_64")[0] == [
        "12.6", "13.0", "13.2"]
    assert resolve_cuda(rule(">=13.1"), facts, torch="2.14.1", platform="x86_64")[0] == ["13.2"]
    none, why = resolve_cuda(rule("default"), facts, torch="2.10.0", platform="aarch64")
    assert none == [] and why == [
        ("default", "PyPI's torch 2.10.0 for aarch64 is a CPU build (no CUDA default)")]
    py = [python_rule("torch", "python")]
    assert resolve_python(py, facts, torch="2.15.0", cuda="13.2", platform="x86_64",
                          allowed=None) == ["3.11", "3.12", "3.13", "3.14", "3.15"]
    assert resolve_python(py, facts, torch="2.14.1", cuda="13.0", platform="aarch64",
                          allowed=python_range(">=3.11,<3.14", "r")) == ["3.11", "3.12", "3.13"]


def test_a_matrix_of_rules_expands_per_torch_and_cpu() -> None:
    assert _ids(matrix_text()) == [
        "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp312",
        "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp312-aarch64",
        "flash-attn-2.8.3.post2-torch2.15.0-cu132-sm100-cp312",
        "flash-attn-2.8.3.post2-torch2.15.0-cu132-sm100-cp312-aarch64",
    ]
    m = load_matrix(text=matrix_text())
    pc = m.find("flash-attn-2.8.3.post2-torch2.15.0-cu132-sm100-cp312")
    assert pc.sha256 == FA and pc.sdist == "flash_attn-2.8.3.post2.tar.gz"
    assert pc.toolchain.torch_index is None and pc.toolchain.torch_requirement == "torch==2.15.0"
    assert pc.torch_wheel == "torch-2.15.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    assert pc.cuda_release == "13.2.2"
    # a non-default build comes from its per-CUDA index
    other = load_matrix(text=matrix_text(torch='["2.14.1"]', cuda='["13.2"]')).cells[0]
    assert other.toolchain.torch_index == "https://download.pytorch.org/whl/cu132"
    assert other.toolchain.torch_requirement == "torch==2.14.1+cu132"


def test_exact_values_keep_working_as_before() -> None:
    text = matrix_text(torch='["2.14.1"]', cuda='["13.0"]', python='["3.11"]',
                       python_range_line="", platform='["x86_64"]', versions='["2.8.3.post2"]')
    assert _ids(text) == ["flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311"]


def test_cells_known_not_to_build_are_data_with_their_reason() -> None:
    text = matrix_text(torch='["latest:2", "2.10.0"]', cuda='["default", "12.6"]',
                       archs='[["9.0"], ["10.0"]]', python='["3.10", "3.11"]',
                       python_range_line="")
    m = load_matrix(text=text)
    reasons = {s.cell: s.reason for s in m.skipped}
    assert reasons["flash-attn-2.8.3.post2-torch2.14.1-cu126-sm100-cp311"].startswith(
        "sm_100 needs CUDA >= 12.8, but the cell asks for CUDA 12.6")
    assert reasons["flash-attn-2.8.3.post2-torch2.15.0-cu132-sm90-cp310"].startswith(
        "torch 2.15.0 ships no cp310 wheel for CUDA 13.2 on x86_64")
    assert reasons["flash-attn-2.8.3.post2-torch2.10.0-aarch64 (cuda default)"] == (
        "PyPI's torch 2.10.0 for aarch64 is a CPU build (no CUDA default)")
    assert reasons["flash-attn-2.8.3.post2-torch2.15.0-cu126-sm90-cp311"].startswith(
        "no build of torch 2.15.0 uses CUDA 12.x (its builds: 13.2 (PyPI's))")
    ids = {pc.cell.id for pc in m.cells}
    assert "flash-attn-2.8.3.post2-torch2.14.1-cu126-sm90-cp311" in ids  # 12.6 builds sm_90
    assert not ids & reasons.keys()
    with pytest.raises(CellError, match="^sm_100 needs CUDA >= 12.8"):  # the cell's fault
        m.find("flash-attn-2.8.3.post2-torch2.14.1-cu126-sm100-cp311")


def test_rules_in_the_wrong_place_are_one_line() -> None:
    def error(text: str) -> str:
        with pytest.raises(ConfigError) as exc:
            load_matrix(text=text)
        return exc.value.lines[0]

    assert error(matrix_text() + '[[include]]\npackage = "flash-attn"\ntorch = "latest"\n'
                 'cuda = "13.0"\narchs = ["10.0"]\npython = "3.11"\n').startswith(
        "[[include]] #1 torch 'latest': a rule belongs in [axes]")
    assert error(matrix_text(torch='["newest"]')).startswith(
        "axes.torch: unparseable torch version 'newest' (or a rule: 'latest', 'latest:N'")
    assert error(matrix_text(python_range_line="python-range = 3")).startswith(
        "axes.python-range must be a version specifier")
    local = matrix_text().replace('recipe = "flash-attn"', 'recipe = "flash-attn"\n'
                                  'source = "."')
    assert error(local).startswith("[packages.flash-attn] versions 'latest': a rule follows")


# -- the lock -------------------------------------------------------------------------------------
@pytest.fixture
def matrix_file(tmp_path: Path) -> Path:
    path = tmp_path / "nightly.toml"
    path.write_text(matrix_text(settings=f'work-dir = "{tmp_path / "work"}"'))
    return path


def test_lock_writes_the_cells_beside_the_matrix_and_builds_read_it(
        matrix_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lock", "--matrix", str(matrix_file), "--offline"]) == 0
    out = capsys.readouterr().out
    assert "add     flash-attn-2.8.3.post2-torch2.15.0-cu132-sm100-cp312 " in out
    assert "wrote nightly.lock: 4 cell(s)" in out
    path = lock_path(matrix_file)
    assert path == matrix_file.with_name("nightly.lock")
    lock = read_lock(path)
    assert lock is not None and loads(path.read_text(), where="x") == lock
    cell = lock.cell("flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp312-aarch64")
    assert cell is not None and cell.sha256 == FA and cell.torch_index == "pypi"
    assert cell.torch_wheel == "torch-2.14.1-cp312-cp312-manylinux_2_28_aarch64.whl"
    assert cell.torch_sha256 and cell.cuda_release == "13.0.3"
    assert {f.what.split(":")[0] for f in lock.facts} >= {
        "torch 2.14.1, 2.15.0", "PyPI's CUDA of torch 2.15.0", "flash-attn 2.8.3.post2"}
    # the lock is what the matrix is made of now, even where the facts say otherwise
    m = load_matrix(matrix_file)
    assert m.lock_state == "locked" and len(m.cells) == 4
    hand = path.read_text().replace(FA, "0" * 64)
    path.write_text(hand)
    facts_without_215 = dataclasses.replace(
        shipped_snapshot(), torch={k: v for k, v in shipped_snapshot().torch.items()
                                   if k != "2.15.0"})
    m = load_matrix(matrix_file, facts=facts_without_215)
    pc = m.find("flash-attn-2.8.3.post2-torch2.15.0-cu132-sm100-cp312")
    assert pc.sha256 == "0" * 64, "the build's sdist hash is the lock's"


def test_check_is_one_table_and_exit_1_and_writes_nothing(
        matrix_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lock", "--matrix", str(matrix_file), "--offline"]) == 0
    path = lock_path(matrix_file)
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    capsys.readouterr()
    # nothing new: current, the file untouched (not even rewritten with the same bytes)
    assert main(["lock", "--matrix", str(matrix_file), "--offline"]) == 0
    assert "nightly.lock is current: 4 cell(s), 0 known not to build; nothing changed" in (
        capsys.readouterr().out)
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime
    assert main(["lock", "--matrix", str(matrix_file), "--offline", "--check"]) == 0
    # the rules change: the lock is stale, --check shows the table and exits 1
    matrix_file.write_text(matrix_file.read_text().replace('"==3.12.*"', '"==3.12.*, !=3.12.1"')
                           .replace('platform = ["x86_64", "aarch64"]', 'platform = ["x86_64"]'))
    assert load_matrix(matrix_file).lock_state == "stale"
    capsys.readouterr()
    assert main(["lock", "--matrix", str(matrix_file), "--offline", "--check"]) == 1
    out = capsys.readouterr().out.splitlines()
    table = [line for line in out if line.startswith(("change", "drop", "add"))]
    assert table[0].split() == ["change", "cell", "detail"]
    assert sorted(line.split()[1] for line in table[1:]) == [
        "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp312-aarch64",
        "flash-attn-2.8.3.post2-torch2.15.0-cu132-sm100-cp312-aarch64"]
    assert all(line.startswith("drop") for line in table[1:])
    assert any(line.startswith("rules   -") for line in out)
    assert out[-1].startswith("nightly.lock is out of date (rules changed, 2 dropped)")
    assert path.read_bytes() == before
    assert main(["lock", "--matrix", str(matrix_file), "--offline", "--json", "--check"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["changed"] is True and doc["written"] is False and len(doc["changes"]) == 3


def test_check_names_every_field_that_differs(
        matrix_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A lock that differs from a refresh in a field other than the version or a hash (here
    the sdist's name, as a lock written before a project was read has it) is one row per cell
    naming the field, and the summary counts them."""
    assert main(["lock", "--matrix", str(matrix_file), "--offline"]) == 0
    path = lock_path(matrix_file)
    path.write_text("\n".join(line for line in path.read_text().splitlines()
                              if not line.startswith("sdist = ")) + "\n")
    capsys.readouterr()
    assert main(["lock", "--matrix", str(matrix_file), "--offline", "--check"]) == 1
    out = capsys.readouterr().out.splitlines()
    rows = [line.split(None, 2) for line in out if line.startswith("change ")][1:]
    assert len(rows) == 4 and {r[2] for r in rows} == {
        "sdist (none) -> flash_attn-2.8.3.post2.tar.gz"}
    assert out[-1] == "nightly.lock is out of date (4 changed); 'factory lock' writes it"


def _locked(**changed: object) -> LockedCell:
    cell = LockedCell(id="c", package="p", version="1.0", sdist="p-1.0.tar.gz", sha256="a" * 64,
                      torch="2.14.1", torch_index="pypi", torch_wheel="torch.whl",
                      torch_sha256="b" * 64, cuda="13.0", cuda_release="13.0.3", archs=(100,),
                      python="3.12", platform="x86_64", manylinux=None)
    return dataclasses.replace(cell, **changed)


def test_every_difference_of_a_lock_is_a_named_row() -> None:
    fact = UsedFact(what="torch 2.14.1: releases", origin=Origin(
        source="https://pypi.org/simple/torch/", fetched="2026-12-01T00:00:00Z", via="get"))
    old = Lock(matrix="m1", locked="t", facts=(fact,), cells=(_locked(),),
               skips=(LockedSkip(package="p", cell="s", reason="old reason"),))
    other = {"package": "q", "version": "1.1", "sdist": None, "sha256": "c" * 64,
             "torch": "2.15.0", "torch_index": "https://download.pytorch.org/whl/cu132",
             "torch_wheel": None, "torch_sha256": "d" * 64, "cuda": "13.2",
             "cuda_release": "13.2.2", "archs": (90,), "python": "3.13",
             "platform": "aarch64", "manylinux": "manylinux_2_28"}
    assert set(other) == {f.name for f in dataclasses.fields(LockedCell)} - {"id"}
    for name, value in other.items():
        new = dataclasses.replace(old, cells=(_locked(**{name: value}),))
        assert not new.same_cells(old)
        (row,) = changes(old, new)
        assert row.kind == "change" and row.detail.startswith(name.replace("_", "-") + " "), row
    assert changes(old, dataclasses.replace(old, cells=(_locked(sdist=None),)))[0].detail == (
        "sdist p-1.0.tar.gz -> (none)")
    assert changes(old, dataclasses.replace(old, cells=(_locked(sha256="c" * 64),)))[0].detail \
        == "sha256 aaaaaaaaaaaa -> cccccccccccc"
    moved = dataclasses.replace(fact, origin=dataclasses.replace(
        fact.origin, source="https://mirror.example/simple/torch/", fetched="later"))
    new = Lock(matrix="m2", locked="t2", facts=(moved,), cells=(_locked(),),
               skips=(LockedSkip(package="p", cell="s", reason="new reason"),))
    rows = [(c.kind, c.cell, c.detail) for c in changes(old, new)]
    assert rows == [
        ("rules", "-", "matrix.toml's rules changed (digest m1 -> m2)"),
        ("reason", "s", "reason 'old reason' -> 'new reason'"),
        ("fact", "-", "torch 2.14.1: releases: https://pypi.org/simple/torch/ (get) -> "
                      "https://mirror.example/simple/torch/ (get)")]
    assert change_summary(changes(old, new)) == (
        "rules changed, 1 with a new reason not to build, 1 fact(s) new, gone or read elsewhere")
    # the time a fact was read is no change, nor is the order cells and skips come in
    reread = dataclasses.replace(old, facts=(dataclasses.replace(
        fact, origin=dataclasses.replace(fact.origin, fetched="later")),))
    assert reread.same_cells(old) and changes(old, reread) == []
    two = dataclasses.replace(old, cells=(_locked(), _locked(id="d")))
    assert dataclasses.replace(two, cells=two.cells[::-1]).same_cells(two)


def test_matrix_shows_the_summary_the_facts_and_the_reasons(
        matrix_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    matrix_file.write_text(matrix_file.read_text().replace('archs = [["10.0"]]',
                                                           'archs = [["9.0"], ["10.0"]]')
                           .replace('cuda = ["default"]', 'cuda = ["all"]'))
    assert main(["matrix", "--matrix", str(matrix_file)]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()
    assert first[0].startswith(f"matrix {matrix_file}: no lock: cells resolved against the "
                               "shipped snapshot of")
    assert first[1].split() == ["package", "cells", "here", "not", "here", "known", "not",
                                "to", "build"]
    assert first[2].split()[0] == "flash-attn"
    # order: summary, facts, cells, the ones known not to build
    assert (out.index("where the facts came from") < out.index("\ncells\n")
            < out.index("known not to build (never attempted)"))
    assert "torch 2.14.1, 2.15.0: releases, Pythons and CPUs" in out
    assert "https://pypi.org/simple/torch/, read 2026-12-02" in out
    assert "declared (PyTorch 2.14 release notes" in out
    assert "why       sm_100 needs CUDA >= 12.8" in out
    # the cells on declared torch builds, plainly, in the summary (before the facts) and each
    summary = out[:out.index("where the facts came from")].splitlines()
    at = next(i for i, line in enumerate(summary) if line.startswith("    declared: "))
    declared = [c for c in load_matrix(matrix_file).cells if c.torch_declared]
    assert declared and {(c.cell.torch, c.cell.cuda) for c in declared} == {
        ("2.14.1", "12.6"), ("2.14.1", "13.2")}
    assert summary[at].startswith(f"    declared: {len(declared)} cell(s) rest on torch builds "
                                  "no index was read for")
    assert summary[at + 1].startswith(
        "        torch 2.14.1 CUDA 12.6 on https://download.pytorch.org/whl/cu126: ")
    assert out.count("(a declared build: unverified)") == len(declared)
    assert main(["matrix", "--matrix", str(matrix_file), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["lock"]["state"] == "none" and doc["skipped"] and doc["facts"]
    assert all(set(s) == {"package", "cell", "reason"} for s in doc["skipped"])
    assert main(["lock", "--matrix", str(matrix_file), "--offline"]) == 0
    assert f"declared: {len(declared)} cell(s) rest on" in capsys.readouterr().out


# -- a refresh against an index (a PyPI stand-in on loopback) --------------------------------------
def _tiny_torch(directory: Path, version: str) -> Path:
    return make_wheel(directory, "torch", version, tag="cp312-cp312-manylinux_2_28_x86_64",
                      requires=['cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"'],
                      requires_python=">=3.10")


def test_a_release_appears_and_the_next_refresh_adds_its_cells(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = StandIn()
    standin.add(_tiny_torch(tmp_path / "w", "2.14.1"))
    standin.add(make_wheel(tmp_path / "w", "cuda-toolkit", "13.0.3"))
    sdist = tmp_path / "w" / "flash_attn-2.8.3.post2.tar.gz"
    sdist.write_bytes(b"not really an sdist")
    standin.add(sdist)
    with standin.serve() as url:
        path = tmp_path / "matrix.toml"
        path.write_text(matrix_text(platform='["x86_64"]', versions='["2.8.3.post2"]',
                                    settings=f'work-dir = "{tmp_path / "work"}"')
                        + f'[indexes]\npypi = "{url}simple/"\npytorch = "{url}whl/{{cuda_tag}}"\n')
        assert main(["lock", "--matrix", str(path)]) == 0
        lock = read_lock(lock_path(path))
        assert lock is not None and [c.id for c in lock.cells] == [
            "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp312"]
        capsys.readouterr()
        standin.add(_tiny_torch(tmp_path / "w", "2.99.0"))
        assert main(["lock", "--matrix", str(path), "--check"]) == 1
        out = capsys.readouterr().out
        assert "add     flash-attn-2.8.3.post2-torch2.99.0-cu130-sm100-cp312 " in out
        assert main(["lock", "--matrix", str(path)]) == 0
        written = lock_path(path).read_bytes()
        assert main(["lock", "--matrix", str(path)]) == 0
        assert lock_path(path).read_bytes() == written
        assert "is current" in capsys.readouterr().out.splitlines()[-1]
    # the facts read are cached under the work dir: later commands resolve against them
    monkeypatch.delenv("FACTORY_FACTS")
    cached = load_matrix(path, use_lock=False).facts
    assert cached.kind == "cache" and "2.99.0" in cached.torch
    os.remove(lock_path(path))


def test_request_resolves_latest_and_default_by_the_same_rules(
        capsys: pytest.CaptureFixture[str]) -> None:
    repo = Path(__file__).resolve().parents[2]
    assert main(["request", "flash-attn", "--torch", "latest", "--cuda", "default",
                 "--arch", "12.0", "--python", "3.12", "--print-cell",
                 "--matrix", str(repo / "matrix.toml")]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "flash-attn-2.8.3.post2-torch2.15.0-cu132-sm120-cp312"
    assert "--torch latest --cuda default -> flash-attn==2.8.3.post2 --torch 2.15.0 " \
           "--cuda 13.2" in captured.err
    assert main(["request", "flash-attn", "--torch", "latest:2", "--cuda", "default", "--arch",
                 "12.0", "--python", "3.12", "--print-cell", "--matrix",
                 str(repo / "matrix.toml")]) == UsageError.exit_code
    assert "--torch 'latest:2' names 2 values (2.15.0, 2.14.1); a request is one cell" in (
        capsys.readouterr().err)


# -- the shipped matrix ---------------------------------------------------------------------------
def test_the_shipped_lock_is_current_and_tracks_what_users_run() -> None:
    repo = Path(__file__).resolve().parents[2]
    m = load_matrix(repo / "matrix.toml")
    assert m.lock_state == "locked", (
        "matrix.lock is out of date with matrix.toml: run 'factory lock' (or --offline)")
    fa = [pc.cell for pc in m.cells_of(["flash-attn"]) if pc.cell.torch != "2.10.0"]
    assert {c.torch for c in fa} == {"2.15.0", "2.14.1"}  # latest:2
    assert {c.archs for c in fa} == {(90,), (100,), (120,)}
    assert {c.platform for c in fa} == {"x86_64", "aarch64"}
    assert {(c.torch, c.cuda) for c in fa} >= {("2.15.0", "13.2"), ("2.14.1", "13.0")}
    assert {c.python for c in fa if c.torch == "2.15.0"} == {"3.11", "3.12", "3.13", "3.14",
                                                             "3.15"}
    assert len(m.cells_of(["factory-example-ext"])) == 1  # the quick start builds one cell
    # every PyPI package of the default matrix is in the snapshot: its cells name their sdist
    lock = read_lock(lock_path(repo / "matrix.toml"))
    assert lock is not None
    pypi = {name for name, pkg in m.packages.items() if pkg.source == "pypi"}
    assert pypi >= {"flash-attn", "grouped-gemm", "torch-scatter"}
    assert [c.id for c in lock.cells if c.package in pypi and not (c.sdist and c.sha256)] == []
    assert all("needs CUDA >= 12.8" in s.reason for s in m.skipped)
