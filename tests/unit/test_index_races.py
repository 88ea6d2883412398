"""Pages against the store under concurrent writers that remove as well as add: yank, unyank
and retention's delete. A hook holds one writer just before a page write while another runs to
completion; whatever the order, the pages must end up what the store says, and
``factory index verify`` must notice when they do not."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from index_wheels import make_wheel, variant_wheel

from factory.index import rebuild_index, verify_index
from factory.index.publish import publish, unyank, yank
from factory.store import LocalStore


class HeldStore(LocalStore):
    """A local store whose page writes from one thread wait at a gate: the thread reaches
    ``arrived`` with its tokens read and its pages rendered, and writes once ``go`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, durable=False)
        self.held: threading.Thread | None = None
        self.arrived = threading.Event()
        self.go = threading.Event()

    def put_if(self, key: str, data: bytes, token: str | None, *, content_type: str = "") -> bool:
        if threading.current_thread() is self.held and not self.go.is_set():
            self.arrived.set()
            assert self.go.wait(30)
        return super().put_if(key, data, token, content_type=content_type)


def _held(store: HeldStore, target: object, *args: object) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target(*args)  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.errors = errors  # type: ignore[attr-defined]
    store.held = thread
    thread.start()
    assert store.arrived.wait(30), "the held writer never reached a page write"
    return thread


def _release(store: HeldStore, thread: threading.Thread) -> None:
    store.go.set()
    thread.join(30)
    assert not thread.is_alive() and not thread.errors  # type: ignore[attr-defined]


def _yanked_on_pages(store: LocalStore, project: str, filename: str) -> set[object]:
    """The yank state each of the project's pages shows for one file."""
    shown: set[object] = set()
    for key in (f"simple/{project}/index.json", f"cu130-torch2.14/simple/{project}/index.json"):
        doc = json.loads(store.read(key) or b"{}")
        shown |= {f["yanked"] for f in doc["files"] if f["filename"] == filename}
    html = (store.read(f"simple/{project}/index.html") or b"").decode()
    line = next(line for line in html.splitlines() if filename in line)
    shown.add("data-yanked" in line)
    return shown


def test_yank_held_at_its_first_page_write_while_unyank_completes(tmp_path: Path) -> None:
    store = HeldStore(tmp_path / "s")
    wheel = variant_wheel(tmp_path / "w", "demo", "1.0", "2.14")
    publish(store, [wheel])
    writer = _held(store, yank, store, wheel.name, "bad build")  # its .yank.json is written
    assert unyank(store, wheel.name) is True  # removes it; the pages still show no yank
    _release(store, writer)
    assert [e.yanked for e in store.wheels()] == [None]
    assert _yanked_on_pages(store, "demo", wheel.name) == {False}, "a yank the store lacks"
    assert verify_index(store).ok


def test_unyank_held_at_its_first_page_write_while_yank_completes(tmp_path: Path) -> None:
    store = HeldStore(tmp_path / "s")
    wheel = variant_wheel(tmp_path / "w", "demo", "1.0", "2.14")
    publish(store, [wheel])
    yank(store, wheel.name, "bad build")
    writer = _held(store, unyank, store, wheel.name)  # its .yank.json is gone
    assert yank(store, wheel.name, "bad build") is True  # back; the pages still show it
    _release(store, writer)
    assert [e.yanked for e in store.wheels()] == ["bad build"]
    assert _yanked_on_pages(store, "demo", wheel.name) == {"bad build", True}
    assert verify_index(store).ok


def test_rebuild_held_while_unyank_completes(tmp_path: Path) -> None:
    store = HeldStore(tmp_path / "s")
    wheel = variant_wheel(tmp_path / "w", "demo", "1.0", "2.14")
    publish(store, [wheel])
    stale = store.read("simple/demo/index.html")
    yank(store, wheel.name, "bad build")
    assert stale is not None
    store.path("simple/demo/index.html").write_bytes(stale)  # a page rebuild must fix
    writer = _held(store, rebuild_index, store)  # it listed the yank
    assert unyank(store, wheel.name) is True  # finds that page already as it should be
    _release(store, writer)
    assert _yanked_on_pages(store, "demo", wheel.name) == {False}
    assert verify_index(store).ok


def test_verify_finds_a_page_whose_yank_the_store_does_not_have(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    wheel = variant_wheel(tmp_path / "w", "demo", "1.0", "2.14")
    publish(store, [wheel])
    before = {k: store.read(k) for k in ("simple/demo/index.html", "simple/demo/index.json")}
    yank(store, wheel.name, "bad build")
    yanked = {k: store.read(k) for k in before}
    store.delete(f"files/demo/{wheel.name}.yank.json")  # the store: not yanked
    for key, data in yanked.items():  # the combined pages: yanked, as a stale writer left them
        assert data is not None
        store.path(key).write_bytes(data)
    problems = verify_index(store, deep=False).problems
    for key in before:
        assert any(p.startswith(key) and "yanked" in p and wheel.name in p for p in problems), (
            problems
        )
    # and the other way round: a yank in the store that a page does not show
    yank(store, wheel.name, "bad build")
    for key, data in before.items():
        assert data is not None
        store.path(key).write_bytes(data)
    problems = verify_index(store, deep=False).problems
    assert any("simple/demo/index.json" in p and "not yanked" in p for p in problems), problems


def test_a_deletion_that_stopped_leaves_no_trap_for_the_next_publish(tmp_path: Path) -> None:
    """Retention's delete stopped after the entry and the wheel were gone: the pages still link
    the wheel, and the .metadata and the yank record are left. verify names both, rebuild
    rewrites the pages, and a new wheel published under the same name is neither yanked by
    the old record nor described by the old metadata."""
    store = LocalStore(tmp_path / "s", durable=False)
    old = make_wheel(tmp_path / "old", "demo", "1.0", requires=["numpy"])
    publish(store, [old])
    yank(store, old.name, "superseded")
    key = f"files/demo/{old.name}"
    store.delete(key + ".entry.json")  # delete_build's first two steps, then it was killed
    store.delete(key)
    report = verify_index(store, deep=False)
    assert report.orphans == (f"{key}.metadata", f"{key}.yank.json")
    assert report.problems and all("link to missing file" in p for p in report.problems)
    rebuild_index(store)  # the pages no longer list it; the side files stay (harmless)
    report = verify_index(store, deep=False)
    assert report.ok and report.orphans == (f"{key}.metadata", f"{key}.yank.json")
    new = make_wheel(tmp_path / "new", "demo", "1.0", requires=["scipy"])
    assert new.name == old.name and new.read_bytes() != old.read_bytes()
    publish(store, [new])
    assert [e.yanked for e in store.wheels()] == [None]
    assert b"scipy" in (store.read(key + ".metadata") or b"")
    assert verify_index(store).ok
