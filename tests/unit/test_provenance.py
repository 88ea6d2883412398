"""Provenance manifests: schema round trip, atomic scrubbed writes, and `factory show`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ops_builds import factory_cli, fake_build, manifest_for, planned, publish_build, write_matrix

from factory.errors import WheelError
from factory.store import open_store
from factory.wheels.provenance import (
    Manifest,
    manifest_name,
    parse_manifest,
    published_builds,
    read_manifest,
    render_text,
    write_manifest,
)


@pytest.fixture
def cells(tmp_path: Path):  # type: ignore[no-untyped-def]
    return planned(write_matrix(tmp_path))


def test_round_trip_keeps_every_field(tmp_path: Path, cells) -> None:  # type: ignore[no-untyped-def]
    wheel = fake_build(tmp_path / "dist", cells[0])
    path = tmp_path / "dist" / manifest_name(wheel.name)
    m = read_manifest(path)
    assert m.wheel == wheel.name
    assert m.cell.id == cells[0].cell.id
    assert m.cell.variant == cells[0].variant  # the index variant, arch set included
    assert m.content_key == cells[0].content_key
    assert m.attempts[0].oom_killed is False and m.attempts[0].objects_built == 5
    again = tmp_path / "again.json"
    write_manifest(again, m, env={})
    assert read_manifest(again) == m
    assert json.loads(again.read_text())["version"] == 1


def test_build_dict_with_extra_attempt_fields_survives(tmp_path: Path, cells) -> None:  # type: ignore[no-untyped-def]
    # The build records more per attempt than the schema names; none of it may be lost.
    wheel = fake_build(tmp_path, cells[0])
    doc = manifest_for(cells[0], wheel, created="2026-02-02T00:00:00+00:00")
    doc["attempts"][0].update({"memory_limit_bytes": 123, "objects_total": 73, "log": "a.log"})
    out = write_manifest(tmp_path / "m.json", doc, env={})
    attempt = json.loads(out.read_text())["attempts"][0]
    assert attempt["objects_total"] == 73 and attempt["memory_limit_bytes"] == 123
    assert read_manifest(out).attempts[0].extra["log"] == "a.log"


def test_secrets_never_reach_the_manifest(tmp_path: Path, cells) -> None:  # type: ignore[no-untyped-def]
    wheel = fake_build(tmp_path, cells[0])
    env = {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value-123", "GITHUB_TOKEN": "ghp_abcdef123456",
           "TWINE_PASSWORD": "hunter2-pw", "HOME": "/home/builder"}
    doc = manifest_for(
        cells[0], wheel, created="2026-02-02T00:00:00+00:00",
        log="https://uploader:hunter2-pw@logs.example/cell.log?sig=s3cr3t-value-123",
        builder={"hostname": "b1", "runner": "docker", "image": "img",
                 "env": {"GITHUB_TOKEN": "ghp_abcdef123456", "HOME": "/home/builder", "API_KEY": "x"}},
    )
    doc["plan"]["reasons"] = ["token ghp_abcdef123456 leaked into a reason"]
    doc["plan"]["model_key"] = "flash-attn/sm100"  # named like a key, but a public label
    text = write_manifest(tmp_path / "m.json", doc, env=env).read_text()
    for secret in env.values():
        if secret != "/home/builder":
            assert secret not in text
    data = json.loads(text)
    assert data["builder"]["env"]["GITHUB_TOKEN"] == "***"
    assert data["builder"]["env"]["API_KEY"] == "***"
    assert data["builder"]["env"]["HOME"] == "/home/builder"
    assert data["log"].startswith("https://uploader:***@logs.example/")
    assert data["content_key"] == cells[0].content_key  # a hash, not a secret
    assert data["plan"]["model_key"] == "flash-attn/sm100"
    assert data["plan"]["reasons"] == ["token *** leaked into a reason"]


def test_write_is_atomic_and_leaves_no_temp(tmp_path: Path, cells) -> None:  # type: ignore[no-untyped-def]
    wheel = fake_build(tmp_path, cells[0])
    target = tmp_path / "out" / "m.json"
    target.parent.mkdir()
    target.write_text("old")
    bad = manifest_for(cells[0], wheel, created="x")
    del bad["cell"]
    with pytest.raises(WheelError):
        write_manifest(target, bad, env={})
    assert target.read_text() == "old"  # an invalid manifest replaces nothing
    write_manifest(target, manifest_for(cells[0], wheel, created="y"), env={})
    assert sorted(os.listdir(target.parent)) == ["m.json"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_unknown_version_and_garbage_are_refused() -> None:
    with pytest.raises(WheelError, match="version 2"):
        parse_manifest(json.dumps({"version": 2}))
    with pytest.raises(WheelError, match="not JSON"):
        parse_manifest(b"{nope")


def test_render_text_names_what_people_ask_about(tmp_path: Path, cells) -> None:  # type: ignore[no-untyped-def]
    wheel = fake_build(tmp_path, cells[0])
    text = render_text(read_manifest(tmp_path / manifest_name(wheel.name)), yanked="old")
    assert wheel.name in text and "[yanked: old]" in text
    assert "MAX_JOBS=2 NVCC_THREADS=1" in text
    assert "attempt 1" in text and "exit 0" in text
    assert cells[0].content_key in text
    assert "glibc floor" not in text  # a manifest from before the floor was recorded
    highest = {"GLIBC": "GLIBC_2.14", "GLIBCXX": "GLIBCXX_3.4.21"}
    floor = {"promised": "2.28", "sysroot": True,
             "reached": {"policy": "manylinux_2_24", "highest": highest}}
    wheel = fake_build(tmp_path / "f", cells[0], floor=floor)
    text = render_text(read_manifest(tmp_path / "f" / manifest_name(wheel.name)))
    assert ("glibc floor promised 2.28 (the glibc 2.31 sysroot); binaries need manylinux_2_24 "
            "(GLIBC GLIBC_2.14, GLIBCXX GLIBCXX_3.4.21)") in text


def test_published_builds_skip_a_manifest_without_its_wheel(tmp_path: Path, cells) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    publish_build(store, tmp_path / "dist", cells[0])
    # A publisher that died after uploading the manifest but before the wheel.
    orphan = store / "files" / "flash-attn" / "flash_attn-9.9-cp311-cp311-linux_x86_64.whl.provenance.json"
    orphan.write_text("{}")
    builds = published_builds(open_store(str(store)))
    assert [b.manifest.cell.id for b in builds] == [cells[0].cell.id]


# -- factory show through the real CLI ----------------------------------------------------------
def test_show_wheel_path_filename_and_cell(tmp_path: Path, cells) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    pc = cells[1]
    w1 = publish_build(store, tmp_path / "d1", pc, created="2026-03-01T00:00:00+00:00")
    w2 = publish_build(store, tmp_path / "d2", pc, created="2026-03-02T00:00:00+00:00",
                       plat="manylinux_2_31_x86_64")

    r = factory_cli("show", str(w1), "--store", str(store))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(w1.name) and pc.cell.id in r.stdout

    r = factory_cli("show", w2.name, "--store", str(store), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["version"] == 1
    assert [m["wheel"] for m in doc["manifests"]] == [w2.name]

    r = factory_cli("show", pc.cell.id, "--store", str(store), "--json")
    assert r.returncode == 0, r.stderr
    assert [m["wheel"] for m in json.loads(r.stdout)["manifests"]] == [w1.name, w2.name]
    assert Manifest.from_dict(json.loads(r.stdout)["manifests"][0]).cell.id == pc.cell.id


def test_show_unknown_targets_fail_in_one_line(tmp_path: Path, cells) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    store.mkdir()
    r = factory_cli("show", cells[0].cell.id, "--store", str(store))
    assert r.returncode == 4
    assert r.stderr.startswith("ERROR no published build of") and "Traceback" not in r.stderr
    r = factory_cli("show", "flash_attn-1.0-cp311-cp311-linux_x86_64.whl", "--store", str(store))
    assert r.returncode == 9 and "no provenance" in r.stderr
    r = factory_cli("show", "not-a-cell", "--store", str(store))
    assert r.returncode == 4 and "unparseable cell id" in r.stderr
