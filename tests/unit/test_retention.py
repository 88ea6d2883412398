"""`factory retain`: newest N per cell by the manifest's "created", older ones yanked; deletion
only with --force and never of a cell's last installable build."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from factory.errors import UsageError
from factory.wheels.provenance import published_builds
from factory.index.retention import ALREADY_YANKED, DELETE, KEEP, LEFTOVER, YANK, plan_retention
from factory.store import open_store

from ops_builds import factory_cli, fake_build, planned, publish_build, write_matrix

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


def _leftover(root: Path, out_dir: Path, pc: Any, **kwargs: Any) -> Path:
    """What a publisher killed before its commit leaves: the wheel, its .metadata and its
    manifest in the store, no index entry (the order factory.index.publish writes them in)."""
    from factory.index.publish import inspect_wheel
    from factory.store.base import METADATA_SUFFIX, PROVENANCE_SUFFIX, file_key

    wheel = fake_build(out_dir, pc, **kwargs)
    s = open_store(str(root))
    key = file_key("flash-attn", wheel.name)
    s.put_new(key, wheel)
    s.put_new(key + METADATA_SUFFIX, inspect_wheel(wheel).metadata)
    s.put_new(key + PROVENANCE_SUFFIX, wheel.with_name(wheel.name + PROVENANCE_SUFFIX))
    return wheel


@pytest.mark.parametrize("created", ["2025-01-01T00:00:00+00:00", "2027-01-01T00:00:00+00:00"])
def test_retain_over_a_killed_publishers_leftover(
    store: tuple[Path, list[Path], Path], tmp_path: Path, created: str
) -> None:
    """The leftover (older or newer than the published builds) is neither yanked nor counted:
    retention does its work on the committed builds, exits 0, and the rebuild after it
    completes the leftover as it always did."""
    root, wheels, _ = store
    cells = planned(tmp_path / "matrix.toml")  # the fixture's matrix
    left = _leftover(root, tmp_path / "left", cells[0], plat="manylinux_2_34_x86_64",
                     created=created)
    r = factory_cli("retain", "--store", str(root), "--keep", "1", "--json")
    assert r.returncode == 0, r.stderr
    actions = {a["wheel"]: a["action"] for a in json.loads(r.stdout)["actions"]}
    assert actions[left.name] == LEFTOVER
    assert actions[wheels[1].name] == KEEP  # the newest committed build, whatever the leftover
    assert actions[wheels[0].name] == actions[wheels[2].name] == YANK
    files = root / "files" / "flash-attn"
    assert not (files / (left.name + ".yank.json")).exists()
    r = factory_cli("index", "verify", "--store", str(root))
    assert r.returncode == 0 and f"files/flash-attn/{left.name}" in r.stdout, r.stdout + r.stderr
    r = factory_cli("index", "rebuild", "--store", str(root))
    assert r.returncode == 0, r.stderr
    assert left.name in _page(root)
    r = factory_cli("retain", "--store", str(root), "--keep", "1", "--json")
    assert r.returncode == 0, r.stderr
    actions = {a["wheel"]: a["action"] for a in json.loads(r.stdout)["actions"]}
    assert LEFTOVER not in actions.values()  # committed now: a build like the others


def test_retain_changes_nothing_when_a_step_would_fail(
    store: tuple[Path, list[Path], Path], tmp_path: Path
) -> None:
    """A manifest that names another file than the wheel beside it: the plan stops before the
    first yank, with one line naming it, and the store is byte for byte as it was."""
    root, wheels, _ = store
    manifest = root / "files" / "flash-attn" / (wheels[2].name + ".provenance.json")
    doc = json.loads(manifest.read_bytes())
    doc["wheel"] = "flash_attn-9.9-cp311-cp311-linux_x86_64.whl"
    manifest.chmod(0o644)
    manifest.write_text(json.dumps(doc))
    before = _snapshot(root)
    r = factory_cli("retain", "--store", str(root), "--keep", "1")
    assert r.returncode == 11, r.stdout + r.stderr
    assert r.stderr.startswith("ERROR retention stopped before changing anything:"), r.stderr
    assert "Traceback" not in r.stderr
    assert _snapshot(root) == before
