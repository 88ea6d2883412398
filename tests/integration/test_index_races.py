"""Yank and unyank of one file racing each other and a publish and a retention deletion (what
`factory retain --force` runs) of other builds of the same project, 300 times (a local store)
and 40 times (S3 on loopback), with ``factory index verify`` after each trial: the pages must
always show the yank state the store has and list exactly the builds it has committed. Each
store primitive the writers use waits a random fraction of a millisecond first, so the
interleavings vary from trial to trial (on the code before page writes took part in the
compare-and-swap, 14 of the 300 local trials of yank and unyank alone ended with pages showing
a yank the store did not have, or hiding one it had, and verify said nothing)."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import index_fixtures
import pytest
from index_wheels import variant_wheel

from factory.index import verify_index
from factory.index.publish import publish, unyank, yank
from factory.index.retention import delete_build
from factory.store import Store, open_store

moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec
store_spec = index_fixtures.store_spec

TRIALS = {"local": 300, "s3": 40}


class Jittery:
    """A store whose page reads and writes, and yank record writes, each wait up to ``most``
    seconds first (seeded: a failing trial can be replayed)."""

    def __init__(self, store: Store, seed: int, most: float = 0.0005) -> None:
        self._store = store
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._most = most

    def _wait(self) -> None:
        with self._lock:
            pause = self._rng.uniform(0, self._most)
        time.sleep(pause)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_with_token(self, key: str) -> tuple[bytes | None, str | None]:
        self._wait()
        return self._store.read_with_token(key)

    def put_if(self, key: str, data: bytes, token: str | None, *, content_type: str) -> bool:
        self._wait()
        return self._store.put_if(key, data, token, content_type=content_type)

    def put_new(self, key: str, data: bytes | Path) -> bool:
        self._wait()
        return self._store.put_new(key, data)

    def delete(self, key: str) -> None:
        self._wait()
        self._store.delete(key)


def _shown(store: Store, filename: str) -> set[object]:
    """The yank state every page of the demo project shows for the file."""
    out: set[object] = set()
    for variant in ("", "cu130-torch2.14/"):
        doc = json.loads(store.read(f"{variant}simple/demo/index.json") or b"{}")
        out |= {bool(f["yanked"]) for f in doc["files"] if f["filename"] == filename}
        page = (store.read(f"{variant}simple/demo/index.html") or b"").decode()
        out |= {"data-yanked" in line for line in page.splitlines() if filename in line}
    return out


def _listed(store: Store) -> dict[str, set[str]]:
    """The files each page of the demo project lists."""
    out: dict[str, set[str]] = {}
    for variant in ("", "cu130-torch2.14/"):
        key = f"{variant}simple/demo/index.json"
        doc = json.loads(store.read(key) or b"{}")
        out[key] = {f["filename"] for f in doc["files"]}
        key = f"{variant}simple/demo/index.html"
        page = (store.read(key) or b"").decode()
        out[key] = {name for name in re.findall(r'>([^<>]+\.whl)</a>', page)}
    return out


def _race(step: Any, delay: float, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    return threading.Thread(target=run)


def test_yank_unyank_publish_and_delete_racing_leave_pages_that_match_the_store(
    store_spec: str, tmp_path: Path
) -> None:
    kind = "s3" if store_spec.startswith("s3://") else "local"
    store = open_store(store_spec)
    wheel = variant_wheel(tmp_path, "demo", "1.0", "2.14")
    publish(store, [wheel])
    name = wheel.name
    older: str | None = None  # the previous trial's new build: this trial deletes it
    for trial in range(TRIALS[kind]):
        rng = random.Random(trial)
        start_yanked = rng.random() < 0.5
        if start_yanked:
            yank(store, name, "first")
        newer = variant_wheel(tmp_path / "new", "demo", f"1.0.{trial + 1}", "2.14")
        racer: Any = Jittery(store, seed=trial)
        errors: list[BaseException] = []
        # one flips the state, the other flips it back, a moment later or not; a new build is
        # published and the one before it deleted, each at a moment of its own
        flips = [lambda: yank(racer, name, f"trial {trial}"), lambda: unyank(racer, name)]
        steps = [*(flips if not start_yanked else flips[::-1]),
                 lambda: publish(racer, [newer])]
        if older is not None:
            steps.append(lambda key=f"files/demo/{older}": delete_build(racer, key))
        threads = [_race(step, rng.uniform(0, 0.002), errors) for step in steps]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        committed = {e.filename: e.yanked for e in store.wheels()}
        assert set(committed) == {name, newer.name}, sorted(committed)
        shown = _shown(store, name)
        verdict = verify_index(store, deep=False)
        assert shown == {committed[name] is not None}, (
            f"trial {trial}: the pages show yanked={shown}, the store {committed[name]!r}; "
            f"verify: {verdict.problems}"
        )
        for page, files in _listed(store).items():
            assert files == set(committed), (trial, page, sorted(files), verdict.problems)
        assert verdict.ok, (trial, verdict.problems)
        if committed[name] is not None:
            unyank(store, name)
        older = newer.name
        newer.unlink()


@pytest.mark.parametrize("store_spec", ["local"], indirect=True)
def test_verify_after_the_race_finds_a_lying_page(store_spec: str, tmp_path: Path) -> None:
    """The check the race relies on, on its own: a page showing a yank the store lacks."""
    store = open_store(store_spec)
    wheel = variant_wheel(tmp_path, "demo", "1.0", "2.14")
    publish(store, [wheel])
    clean = store.read("simple/demo/index.json")
    yank(store, wheel.name, "x")
    lying = store.read("simple/demo/index.json")
    unyank(store, wheel.name)
    assert clean is not None and lying is not None and lying != clean
    _, token = store.read_with_token("simple/demo/index.json")
    assert store.put_if("simple/demo/index.json", lying, token, content_type="application/json")
    problems = verify_index(store, deep=False).problems
    assert any("as yanked" in p and wheel.name in p for p in problems), problems
