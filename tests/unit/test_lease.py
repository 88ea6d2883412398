"""What builders read from the shared store is untrusted input: a malformed history record is
skipped (the others still merge), a malformed or implausible lease object is treated as expired
and taken over with one warning, and ``factory index verify`` names both. And a lease lost to a
takeover is reported to the build, which then publishes nothing."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from index_wheels import variant_wheel

from factory.build.lease import CellLease, Hold, LeaseLost, hold_cell
from factory.build.pipeline import publish_built
from factory.errors import StoreError
from factory.index import verify_index
from factory.store import LocalStore
from factory.logger import Log
from factory.matrix.cell import Cell
from factory.planning.memory_model import BuildMeasurement, MemoryHistory, RecordedRun
from factory.planning.shared_history import BadRecord, merge_into, push, record_document

CELL = Cell(package="demo", version="1", torch="2.11.0", cuda="13.0", archs=(90,), python="3.12")


def _good() -> dict[str, object]:
    return record_document(BuildMeasurement(
        cell=CELL, nvcc_threads=1, max_jobs=2, cpus=4, peak_job_bytes=2**30,
        object_seconds={"a": 1.0}, object_peaks={"a": 2**30},
    ))


def _with(**changes: object) -> bytes:
    doc = _good()
    cell = dict(doc["cell"])  # type: ignore[call-overload]
    for name, value in changes.items():
        if name in cell:
            cell[name] = value
        else:
            doc[name] = value
    doc["cell"] = cell
    return json.dumps(doc).encode()


RUN = RecordedRun(source="factory build x", date="2026-12-01", max_jobs=2, cpus=4,
                  compile_seconds=12.5, peak_bytes=2**30, machine="cpu x 4", order=("a", "b"))


def _run_with(**changes: object) -> bytes:
    """A record whose whole run has fields changed."""
    return _with(run={**RUN.as_dict(), **changes})


MALFORMED = {
    "a list": b"[]",
    "a number": b"42",
    "null": b"null",
    "a string": b'"history"',
    "not JSON": b"{not json",
    "not UTF-8": b"\xff\xfe{",
    "no archs": _with(archs=[]),
    "an unknown CUDA": _with(cuda="x"),
    "archs as text": _with(archs="90"),
    "a cell that is a list": json.dumps({**_good(), "cell": []}).encode(),
    "a peak that is text": _with(peak_job_bytes="big"),
    "a negative peak": _with(peak_job_bytes=-5),
    "an absurd peak": _with(peak_job_bytes=2**80),
    "seconds that are text": _with(object_seconds={"a": "slow"}),
    "object peaks as a list": _with(object_peaks=[1, 2]),
    "no version": json.dumps({k: v for k, v in _good().items() if k != "version"}).encode(),
    "max_jobs of zero": _with(max_jobs=0),
    "nested past the parser's depth": b"[" * 100_000 + b"]" * 100_000,
    "version true": json.dumps({**_good(), "version": True}).encode(),
    "version as text": json.dumps({**_good(), "version": "1"}).encode(),
    "a cell version true": _with(version=True),
    "nvcc_threads as text": _with(nvcc_threads="1"),
    "cpus as a list": _with(cpus=[4]),
    "a source that is an object": _with(source={"a": 1}),
    "a package that is a number": _with(package=5),
    "a python that is a list": _with(python=["3.12"]),
    "a platform that is a number": _with(platform=64),
    "an unknown platform": _with(platform="sparc"),
    "archs of true": _with(archs=[True]),
    "archs nested": _with(archs=[[90]]),
    "a negative arch": _with(archs=[-90]),
    "seconds that are a list": _with(object_seconds={"a": [1.0]}),
    "seconds that are NaN": _with(object_seconds={"a": float("nan")}),
    "an object peak that is an object": _with(object_peaks={"a": {"b": 1}}),
    "an object peak that is true": _with(object_peaks={"a": True}),
    "a run that is a number": _with(run=42),
    "a run that is text": _with(run="abc"),
    "a run that is a list": _with(run=[1]),
    "a run that is false": _with(run=False),
    "a run that is empty": _with(run={}),
    "a run's max_jobs as text": _run_with(max_jobs="2"),
    "a run's max_jobs true": _run_with(max_jobs=True),
    "a run's max_jobs fractional": _run_with(max_jobs=1.5),
    "a run's cpus as a list": _run_with(cpus=[4]),
    "a run's seconds as text": _run_with(compile_seconds="12"),
    "a run's seconds NaN": _run_with(compile_seconds=float("nan")),
    "a run's order a number": _run_with(order=5),
    "a run's order of numbers": _run_with(order=[1, 2]),
    "a run's order an object": _run_with(order={"a": 1}),
    "a run's peak_of unknown": _run_with(peak_of="gpu"),
    "a run's peak_of a number": _run_with(peak_of=5),
    "a run's peak negative": _run_with(peak_bytes=-1),
    "a run's peak as text": _run_with(peak_bytes="1g"),
    "a run's source a list": _run_with(source=["x"]),
    "a run's date a number": _run_with(date=20261201),
    "a run's machine an object": _run_with(machine={"cpu": "x"}),
    "a run's field with a line break": _run_with(peak_of="x\ny"),
}


def test_malformed_history_records_are_skipped_and_the_rest_merge(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for i, data in enumerate(MALFORMED.values()):
        assert store.put_new(f"history/records/2026-bad-{i:02d}.json", data)
    push(store, BuildMeasurement(cell=CELL, nvcc_threads=1, max_jobs=2, cpus=4,
                                 peak_job_bytes=3 * 2**30))
    push(store, BuildMeasurement(cell=CELL, nvcc_threads=1, max_jobs=2, cpus=4,
                                 peak_job_bytes=None, object_seconds={"a": 1.0, "b": 2.0},
                                 run=RUN))
    history = MemoryHistory.load(tmp_path / "mine.json")
    skipped: list[BadRecord] = []
    assert merge_into(history, store, skipped) == 2  # what builders write reads back
    assert sorted(b.key for b in skipped) == [
        f"history/records/2026-bad-{i:02d}.json" for i in range(len(MALFORMED))
    ]
    assert all(b.problem.startswith("corrupt history record: ") for b in skipped)
    assert all("\n" not in b.problem for b in skipped)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_verify_names_each_malformed_record(case: str, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put_new("history/records/x.json", MALFORMED[case])
    problems = verify_index(store, deep=False).problems
    assert [p for p in problems if p.startswith("history/records/x.json: corrupt")], problems


BAD_LEASES = {
    "a list": b"[]",
    "null": b"null",
    "not JSON": b"\x00lease",
    "no holder": json.dumps({"version": 1, "cell": "c", "expires": 9e9}).encode(),
    "a holder that is a number": json.dumps({"cell": "c", "holder": 7, "expires": 9e9}).encode(),
    "expires as text": json.dumps({"cell": "c", "holder": "h", "expires": "never"}).encode(),
    "expires for ever": json.dumps({"cell": "c", "holder": "h", "expires": 1e300}).encode(),
    "nested past the parser's depth": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("case", sorted(BAD_LEASES))
def test_a_malformed_lease_is_taken_over_with_one_warning(
    case: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalStore(tmp_path / "store")
    assert store.put_new("leases/k1.json", BAD_LEASES[case])
    problems = verify_index(store, deep=False).problems
    assert [p for p in problems if p.startswith("leases/k1.json: ")], problems
    lease = CellLease(store, content_key="k1", cell="c", holder="me", ttl=60)
    with caplog.at_level(logging.WARNING, logger="factory.build.lease"):
        assert lease.try_acquire() is None  # taken, not waited for, not an error
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "leases/k1.json" in warnings[0], warnings
    doc = json.loads(store.read("leases/k1.json") or b"")
    assert doc["holder"] == "me"
    assert verify_index(store, deep=False).ok


def test_a_published_cell_is_never_claimed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    with hold_cell(store, content_key="k2", cell="c", published=lambda: True) as mine:
        assert not mine
    assert store.read("leases/k2.json") is None


def test_a_lost_lease_stops_the_publish(tmp_path: Path) -> None:
    """Taken over while this builder was away: the Hold says so, and the pipeline's publish
    step (which renews with a conditional write first) publishes nothing."""
    store = LocalStore(tmp_path / "store")
    now = [1000.0]
    mine = CellLease(store, content_key="k3", cell="c", holder="a", ttl=60, clock=lambda: now[0])
    assert mine.try_acquire() is None
    now[0] += 61  # paused past the TTL
    other = CellLease(store, content_key="k3", cell="c", holder="b", ttl=60,
                      clock=lambda: now[0])
    assert other.try_acquire() is None
    hold = Hold(mine)
    hold.check()  # the heartbeat has not run: nothing known yet
    wheel = variant_wheel(tmp_path / "w", "demo", "1.0", "2.14")
    with pytest.raises(LeaseLost, match="lost the cell's lease .*names b as its holder"):
        publish_built(store, wheel, Log(stream=io.StringIO()), lease=hold)
    assert store.wheels() == []
    with pytest.raises(LeaseLost):
        hold.check()  # and it stays lost
    assert LeaseLost.exit_code == 12


def test_a_renewal_that_cannot_reach_the_store_is_not_a_loss(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    lease = CellLease(store, content_key="k4", cell="c", holder="a", ttl=60)
    assert lease.try_acquire() is None

    class Down(LocalStore):
        def read_with_token(self, key: str) -> tuple[bytes | None, str | None]:
            raise StoreError("cannot reach the store")

    lease.store = Down(tmp_path / "store")
    with pytest.raises(StoreError):
        lease.renew()
    assert lease.lost is None
    lease.store = store  # back: still ours (nobody took it), renewed
    assert lease.renew() is True
