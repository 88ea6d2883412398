"""Index rebuild time for 10 000 wheels (goal: <= 2 s), plus one incremental publish into it.

    python benchmarks/bench_index_rebuild.py [--wheels 10000] [--projects 50]

The store is filled with small valid wheels, their .metadata and index entries through the
Store API (no pages), then: a full rebuild from nothing, a rebuild with every page already
current, one real ``publish`` of a new wheel (only its pages rewritten), and ``verify --quick``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from index_wheels import variant_wheel  # noqa: E402

from factory.index import rebuild_index, verify_index  # noqa: E402
from factory.index.publish import inspect_wheel, publish  # noqa: E402
from factory.store import LocalStore, WheelEntry  # noqa: E402
from factory.store.base import ENTRY_SUFFIX, METADATA_SUFFIX, file_key  # noqa: E402

TORCH_MINORS = [f"2.{m}" for m in range(3, 15)]  # 12 variants


def fill(store: LocalStore, work: Path, wheels: int, projects: int) -> None:
    template = variant_wheel(work, "template", "1.0", "2.14")
    data = template.read_bytes()
    info = inspect_wheel(template)
    for i in range(wheels):
        torch = TORCH_MINORS[i % len(TORCH_MINORS)]
        project = f"pkg{i % projects}"
        version = f"1.{i // projects}+cu130torch{torch}"
        filename = f"{project}-{version}-cp311-cp311-linux_x86_64.whl"
        key = file_key(project, filename)
        store.put_new(key, data)  # the bytes do not matter to a rebuild: it never reads wheels
        store.put_new(key + METADATA_SUFFIX, info.metadata)
        entry = WheelEntry(
            filename=filename,
            project=project,
            version=version,
            sha256=hashlib.sha256(filename.encode()).hexdigest(),
            size=len(data),
            metadata_sha256=hashlib.sha256(info.metadata).hexdigest(),
            requires_python=">=3.9",
            variant=f"cu130-torch{torch}",
            uploaded="2026-11-29T00:00:00.000000Z",
        )
        store.put_new(key + ENTRY_SUFFIX, entry.to_json())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wheels", type=int, default=10_000)
    parser.add_argument("--projects", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rebuild-") as tmp:
        work = Path(tmp)
        store = LocalStore(work / "store", durable=False)  # setup only; timed steps are the same
        t0 = time.perf_counter()
        fill(store, work, args.wheels, args.projects)
        setup = time.perf_counter() - t0
        rows = []
        cold = rebuild_index(store)
        rows.append(("rebuild, no pages yet", cold.seconds, f"{cold.pages_written} pages written"))
        warm = rebuild_index(store)
        rows.append(
            ("rebuild, pages current", warm.seconds, f"{warm.pages_unchanged} pages unchanged")
        )
        new = variant_wheel(work / "new", "pkg0", "9.9", "2.14")
        t0 = time.perf_counter()
        report = publish(LocalStore(work / "store"), [new])
        rows.append(
            (
                "publish 1 wheel (incremental)",
                time.perf_counter() - t0,
                f"{report.pages_changed} pages rewritten",
            )
        )
        t0 = time.perf_counter()
        verdict = verify_index(store, deep=False)
        rows.append(
            (
                "verify --quick",
                time.perf_counter() - t0,
                f"{verdict.links} links, {len(verdict.problems)} problems",
            )
        )
        print(
            f"{args.wheels} wheels, {args.projects} projects, {len(TORCH_MINORS)} variants "
            f"(store filled in {setup:.1f} s)"
        )
        print(f"| {'step':<32} | {'seconds':>8} | {'detail':<28} |")
        print(f"|{'-' * 34}|{'-' * 10}|{'-' * 30}|")
        for name, seconds, detail in rows:
            print(f"| {name:<32} | {seconds:>8.3f} | {detail:<28} |")
        print(f"goal: full rebuild <= 2 s: {'met' if cold.seconds <= 2 else 'NOT met'}")
        return 0 if verdict.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
