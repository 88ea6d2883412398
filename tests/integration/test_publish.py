"""Publishing and yanking: validation, idempotence, conflicts, crashes, concurrent publishers."""

from __future__ import annotations

import io
import json
import subprocess
import zipfile
from pathlib import Path

import index_fixtures
import pytest
from index_fixtures import cli
from index_wheels import make_wheel, variant_wheel

from factory.errors import ConflictError, StoreError
from factory.index import rebuild_index, verify_index
from factory.index.publish import inspect_wheel, publish, yank
from factory.store import Store, open_store

# The shared fixtures (a module of their own: conftest.py belongs to everyone).
moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec
store = index_fixtures.store
store_spec = index_fixtures.store_spec


def test_publish_uploads_side_files_and_same_bytes_again_is_a_no_op(
    store: Store, tmp_path: Path
) -> None:
    wheel = variant_wheel(tmp_path, "fa-demo", "1.0", "2.14")
    manifest = {
        "version": 1,
        "cell": {"package": "fa-demo"},
        "content_key": "k1",
        "sha256": inspect_wheel(wheel).sha256,
    }
    wheel.with_name(wheel.name + ".provenance.json").write_text(json.dumps(manifest))
    first = publish(store, [wheel])
    assert first.published == (wheel.name,) and first.pages_changed > 0
    key = f"files/fa-demo/{wheel.name}"
    assert store.read(key) == wheel.read_bytes()
    with zipfile.ZipFile(io.BytesIO(wheel.read_bytes())) as zf:
        assert store.read(key + ".metadata") == zf.read(
            "fa_demo-1.0+cu130torch2.14.dist-info/METADATA"
        )
    assert store.published_content_keys() == {"k1"}
    pages = {o.key: store.read(o.key) for o in store.page_objects()}
    again = publish(store, [wheel])
    assert again.published == () and again.unchanged == (wheel.name,) and again.pages_changed == 0
    assert {o.key: store.read(o.key) for o in store.page_objects()} == pages


def test_same_name_different_bytes_is_refused(store: Store, tmp_path: Path) -> None:
    publish(store, [make_wheel(tmp_path / "a", "demo", "1.0")])
    other = make_wheel(tmp_path / "b", "demo", "1.0", requires=["numpy"])
    with pytest.raises(ConflictError):
        publish(store, [other])
    assert b"numpy" not in (store.read("files/demo/demo-1.0-py3-none-any.whl.metadata") or b"")


def test_yank_marks_the_file_and_unknown_files_are_refused(store: Store, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "demo", "1.0")
    publish(store, [wheel])
    assert yank(store, wheel.name, "broken build") is True
    assert yank(store, wheel.name, "again") is False
    assert 'data-yanked="broken build"' in store.read("simple/demo/index.html").decode()
    assert json.loads(store.read("simple/demo/index.json"))["files"][0]["yanked"] == "broken build"
    assert [w.yanked for w in store.wheels()] == ["broken build"]
    with pytest.raises(StoreError, match="not published"):
        yank(store, "demo-9.9-py3-none-any.whl", "x")


def test_a_publisher_killed_before_commit_leaves_a_verifying_index(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = make_wheel(tmp_path, "demo", "1.0")
    publish(store, [first])
    second = make_wheel(tmp_path, "demo", "2.0")
    real_put_new = type(store).put_new

    def dies_at_commit(self: Store, key: str, data: object) -> bool:
        if key.endswith(".entry.json"):
            raise StoreError("simulated crash")
        return real_put_new(self, key, data)  # type: ignore[arg-type]

    monkeypatch.setattr(type(store), "put_new", dies_at_commit)
    with pytest.raises(StoreError):
        publish(store, [second])
    monkeypatch.undo()
    verdict = verify_index(store)
    assert verdict.ok and verdict.pending == (f"files/demo/{second.name}",)
    assert rebuild_index(store).completed == (second.name,)
    verdict = verify_index(store)
    assert verdict.ok and verdict.pending == () and verdict.wheels == 2


@pytest.mark.integration
def test_cli_publish_yank_and_index(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    wheel = make_wheel(tmp_path, "demo", "1.0")
    run = lambda *a: subprocess.run(cli(*a), capture_output=True, text=True)  # noqa: E731
    assert run("publish", "--store", str(store_dir), str(wheel)).returncode == 0
    assert run("yank", "--store", str(store_dir), wheel.name, "--reason", "bad").returncode == 0
    assert run("index", "rebuild", "--store", str(store_dir)).returncode == 0
    ok = run("index", "verify", "--store", str(store_dir), "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    (store_dir / "files" / "demo" / wheel.name).write_bytes(b"tampered")
    bad = run("index", "verify", "--store", str(store_dir))
    assert bad.returncode == 15 and bad.stderr.startswith("ERROR ")


@pytest.mark.integration
def test_eight_publishers_at_once_lose_no_wheel(store_spec: str, tmp_path: Path) -> None:
    """8 publisher processes at once, 3 rounds: every wheel listed, every page verifies."""
    expected = set()
    for round_ in range(3):
        wheels = [
            variant_wheel(
                tmp_path / f"r{round_}",
                f"proj{i % 2}",
                f"1.{round_}.{i}",
                ("2.13", "2.14")[i % 4 // 2],
            )
            for i in range(8)
        ]
        expected |= {w.name for w in wheels}
        procs = [
            subprocess.Popen(
                cli("publish", "--store", store_spec, str(w)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for w in wheels
        ]
        outcomes = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
        for p in procs:
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()
        assert [rc for rc, _ in outcomes] == [0] * 8, outcomes
    store = open_store(store_spec)
    assert {w.filename for w in store.wheels()} == expected
    listed = set()
    for project in ("proj0", "proj1"):
        listed |= {
            f["filename"] for f in json.loads(store.read(f"simple/{project}/index.json"))["files"]
        }
    assert listed == expected
    verdict = verify_index(store)
    assert verdict.ok, verdict.problems
    result = subprocess.run(
        cli("index", "verify", "--store", store_spec), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
