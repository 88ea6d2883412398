"""What the catalog's GPU checks share: relative error and one result table (needs torch).

Each check_<package>.py compares an installed package's kernels with a plain-PyTorch reference
of what they compute, prints one row per case and exits non-zero on any failure.
"""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


class Table:
    """Rows of (case, {name: relative error}, tolerance); prints them and counts failures."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.rows: list[tuple[str, dict[str, float], float, bool]] = []

    def add(self, case: str, errs: dict[str, float], tol: float,
            tensors: tuple[torch.Tensor, ...] = ()) -> None:
        bad = any(bool(torch.isnan(t).any()) for t in tensors)
        ok = not bad and all(e < tol for e in errs.values())
        self.rows.append((case, errs, tol, ok))

    def report(self) -> int:
        print(self.title)
        width = max(len(c) for c, *_ in self.rows)
        for case, errs, tol, ok in self.rows:
            values = "  ".join(f"{k} {v:8.2e}" for k, v in errs.items())
            print(f"{case:{width}}  {values}  tol {tol:.0e}  {'ok' if ok else 'FAIL'}")
        failed = sum(not ok for *_, ok in self.rows)
        print(f"{len(self.rows) - failed} passed, {failed} failed")
        return 1 if failed else 0


def device_line() -> str:
    return f"torch {torch.__version__}, {torch.cuda.get_device_name()}"
