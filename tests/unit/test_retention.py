"""`factory retain`: newest N per cell by the manifest's "created", older ones yanked; deletion
only with --force and never of a cell's last installable build."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from factory.errors import UsageError
from factory.wheels.provenance import published_builds
from factory.index.retention import ALREADY_YANKED, DELETE, KEEP, YANK, plan_retention
from factory.store import open_store

from ops_builds import factory_cli, planned, publish_build, write_matrix

# Three builds of one cell: distinct filenames through distinct platform tags. Their "created"
# order is not their filename order, so a sort by name would pick the wrong one.
BUILDS = [
    ("manylinux_2_36_x86_64", "2026-01-01T00:00:00+00:00"),  # oldest
    ("manylinux_2_28_x86_64", "2026-03-01T00:00:00+00:00"),  # newest
    ("manylinux_2_31_x86_64", "2026-02-01T00:00:00+00:00"),
]


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, list[Path], Path]:
    cells = planned(write_matrix(tmp_path))
    root = tmp_path / "store"
    wheels = [publish_build(root, tmp_path / f"d{i}", cells[0], plat=plat, created=created)
              for i, (plat, created) in enumerate(BUILDS)]
    only = publish_build(root, tmp_path / "only", cells[1], created="2020-01-01T00:00:00+00:00")
    return root, wheels, only


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _page(root: Path) -> str:
    return (root / "simple" / "flash-attn" / "index.html").read_text()


def test_dry_run_changes_nothing(store: tuple[Path, list[Path], Path]) -> None:
    root, wheels, _ = store
    before = _snapshot(root)
    r = factory_cli("retain", "--store", str(root), "--keep", "1", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("would yank") == 2
    assert re.search(rf"^would yank +{re.escape(wheels[0].name)} ", r.stdout, re.M)
    assert re.search(rf"^would yank +{re.escape(wheels[2].name)} ", r.stdout, re.M)
    assert _snapshot(root) == before


def test_keep_one_yanks_the_older_builds_and_deletes_nothing(store: tuple[Path, list[Path], Path]) -> None:
    root, wheels, only = store
    r = factory_cli("retain", "--store", str(root), "--keep", "1", "--json")
    assert r.returncode == 0, r.stderr
    actions = {a["wheel"]: a["action"] for a in json.loads(r.stdout)["actions"]}
    assert actions == {wheels[1].name: KEEP, wheels[0].name: YANK, wheels[2].name: YANK, only.name: KEEP}
    files = root / "files" / "flash-attn"
    for w in wheels + [only]:
        assert (files / w.name).is_file()  # yanked files stay: pins and lock files still resolve
    assert (files / (wheels[0].name + ".yank.json")).is_file()
    assert not (files / (wheels[1].name + ".yank.json")).exists()
    page = _page(root)
    for w in (wheels[0], wheels[2]):
        line = next(x for x in page.splitlines() if w.name + "<" in x)
        assert "data-yanked=" in line
    assert "data-yanked" not in next(x for x in page.splitlines() if wheels[1].name + "<" in x)
    # A second run finds them yanked already and changes nothing.
    before = _snapshot(root)
    r = factory_cli("retain", "--store", str(root), "--keep", "1", "--json")
    assert r.returncode == 0
    assert sorted(a["action"] for a in json.loads(r.stdout)["actions"]) == [ALREADY_YANKED] * 2 + [KEEP] * 2
    assert _snapshot(root) == before


def test_force_deletes_older_builds_but_never_the_only_one(store: tuple[Path, list[Path], Path]) -> None:
    root, wheels, only = store
    r = factory_cli("retain", "--store", str(root), "--keep", "1", "--force")
    assert r.returncode == 0, r.stderr
    files = root / "files" / "flash-attn"
    left = sorted(p.name for p in files.iterdir())
    for gone in (wheels[0], wheels[2]):
        assert not [n for n in left if n.startswith(gone.name)], left
        assert gone.name not in _page(root)
    assert (files / wheels[1].name).is_file() and (files / only.name).is_file()
    r = factory_cli("index", "verify", "--store", str(root))
    assert r.returncode == 0, r.stdout + r.stderr


def test_force_keeps_an_older_build_when_every_newer_one_is_yanked(
    store: tuple[Path, list[Path], Path]
) -> None:
    root, wheels, _ = store
    from factory.index.publish import yank

    s = open_store(str(root))
    yank(s, wheels[1].name, "broken kernels")
    actions = plan_retention(published_builds(s), keep=1, force=True)
    by_wheel = {a.wheel: a.action for a in actions}
    assert by_wheel[wheels[0].name] == YANK and by_wheel[wheels[2].name] == YANK
    assert DELETE not in by_wheel.values()


def test_keep_zero_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        plan_retention([], keep=0, force=False)
    r = factory_cli("retain", "--store", str(tmp_path), "--keep", "0")
    assert r.returncode == 2 and r.stderr.startswith("ERROR --keep must be at least 1")
