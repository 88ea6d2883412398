"""Correctness of an installed grouped-gemm against plain PyTorch (needs a CUDA GPU).

grouped_gemm.ops.gmm (bf16, the only type it takes): a [sum(batch_sizes), k] against
b [experts, k, n] (or its transpose), one matmul per expert in float32 as the reference;
forward and backward (da, db), with empty and uneven groups.

    python benchmarks/gpu/check_grouped_gemm.py
"""

from __future__ import annotations

import sys

import torch
from gpu_check import Table, device_line, rel_err


def reference(a: torch.Tensor, b: torch.Tensor, sizes: list[int], trans_b: bool) -> torch.Tensor:
    outs, start = [], 0
    for i, rows in enumerate(sizes):
        w = b[i].t() if trans_b else b[i]
        outs.append(a[start:start + rows] @ w)
        start += rows
    return torch.cat(outs)


def main() -> int:
    from grouped_gemm import ops

    torch.manual_seed(0)
    dev = "cuda"
    table = Table(f"grouped-gemm, {device_line()}")
    cases = [([128] * 8, 512, 1024), ([0, 300, 17, 1000, 64, 5, 0, 256], 768, 256),
             ([2048, 1024], 1024, 4096)]
    for sizes, k, n in cases:
        for trans_b in (False, True):
            experts = len(sizes)
            a = torch.randn(sum(sizes), k, device=dev, dtype=torch.bfloat16, requires_grad=True)
            shape = (experts, n, k) if trans_b else (experts, k, n)
            b = (torch.randn(*shape, device=dev, dtype=torch.bfloat16) / k**0.5).requires_grad_()
            batch_sizes = torch.tensor(sizes, dtype=torch.long)  # on the CPU, as gmm wants
            out = ops.gmm(a, b, batch_sizes, trans_b=trans_b)
            dout = torch.randn_like(out)
            out.backward(dout)
            ar, br = (t.detach().float().requires_grad_(True) for t in (a, b))
            ref = reference(ar, br, sizes, trans_b)
            ref.backward(dout.float())
            errs = {"out": rel_err(out, ref), "da": rel_err(a.grad, ar.grad),
                    "db": rel_err(b.grad, br.grad)}
            table.add(f"experts {experts} k {k:4} n {n:4} trans_b {str(trans_b):5}", errs, 2e-2,
                      (out, a.grad, b.grad))
    return table.report()


if __name__ == "__main__":
    sys.exit(main())
