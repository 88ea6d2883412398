"""Yank and unyank of one file racing each other, 300 times (a local store) and 40 times (S3 on
loopback), with ``factory index verify`` after each trial: the pages must always show the
yank state the store has. Each store primitive the writers use waits a random fraction of a
millisecond first, so the interleavings vary from trial to trial (on the code before this
check, 14 of the 300 local trials ended with pages showing a yank the store did not have, or
hiding one it had, and verify said nothing)."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import index_fixtures
import pytest
from index_wheels import variant_wheel

from factory.index import verify_index
from factory.index.publish import publish, unyank, yank
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


def _flip(
    how: Any, store: Jittery, name: str, trial: int, delay: float, errors: list[BaseException]
) -> None:
    time.sleep(delay)
    try:
        if how is yank:
            yank(store, name, f"trial {trial}")  # type: ignore[arg-type]
        else:
            unyank(store, name)  # type: ignore[arg-type]
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


def test_yank_and_unyank_racing_leave_pages_that_match_the_store(
    store_spec: str, tmp_path: Path
) -> None:
    kind = "s3" if store_spec.startswith("s3://") else "local"
    store = open_store(store_spec)
    wheel = variant_wheel(tmp_path, "demo", "1.0", "2.14")
    publish(store, [wheel])
    name = wheel.name
    for trial in range(TRIALS[kind]):
        rng = random.Random(trial)
        start_yanked = rng.random() < 0.5
        if start_yanked:
            yank(store, name, "first")
        racer = Jittery(store, seed=trial)
        errors: list[BaseException] = []
        # one flips the state, the other flips it back, a moment later or not
        flips = (yank, unyank) if not start_yanked else (unyank, yank)
        delays = (rng.uniform(0, 0.0005), rng.uniform(0, 0.002))
        threads = [
            threading.Thread(target=_flip, args=(how, racer, name, trial, delay, errors))
            for how, delay in zip(flips, delays, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        in_store = {e.filename: e.yanked for e in store.wheels()}[name]
        shown = _shown(store, name)
        verdict = verify_index(store, deep=False)
        assert shown == {in_store is not None}, (
            f"trial {trial}: the pages show yanked={shown}, the store {in_store!r}; "
            f"verify: {verdict.problems}"
        )
        assert verdict.ok, (trial, verdict.problems)
        if in_store is not None:
            unyank(store, name)


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
