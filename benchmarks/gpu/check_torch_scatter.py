"""Correctness of an installed torch-scatter against plain PyTorch (needs a CUDA GPU).

scatter (sum, mean, max, min) against Tensor.scatter_reduce, segment_csr and segment_coo (sum,
mean, max) against the same reductions over sorted indices, forward and (sum, mean, max)
backward, fp32 and fp16, on CUDA tensors (the package's CUDA extension).

    python benchmarks/gpu/check_torch_scatter.py
"""

from __future__ import annotations

import itertools
import sys

import torch
from gpu_check import Table, device_line, rel_err

TORCH_REDUCE = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}


def reference(src: torch.Tensor, index: torch.Tensor, size: int, reduce: str) -> torch.Tensor:
    out = torch.zeros(size, src.shape[1], device=src.device, dtype=src.dtype)
    idx = index.unsqueeze(1).expand_as(src)
    return out.scatter_reduce(0, idx, src, reduce=TORCH_REDUCE[reduce], include_self=False)


def main() -> int:
    import torch_scatter
    from torch_scatter import scatter, segment_coo, segment_csr

    torch.manual_seed(0)
    dev = "cuda"
    table = Table(f"torch-scatter {torch_scatter.__version__}, {device_line()}")
    n, feats, size = 100_000, 32, 1000
    for dtype, reduce in itertools.product((torch.float32, torch.float16),
                                           ("sum", "mean", "max", "min")):
        index = torch.randint(0, size, (n,), device=dev)
        src = torch.randn(n, feats, device=dev, dtype=dtype)
        dout = torch.randn(size, feats, device=dev, dtype=dtype)
        a = src.clone().requires_grad_(True)
        out = scatter(a, index, dim=0, dim_size=size, reduce=reduce)
        r = src.float().requires_grad_(True)
        ref = reference(r, index, size, reduce)
        tol = 1e-5 if dtype == torch.float32 else 5e-3
        errs = {"out": rel_err(out, ref)}
        if reduce in ("sum", "mean"):  # max/min: ties break differently from scatter_reduce
            out.backward(dout)
            ref.backward(dout.float())
            errs["dsrc"] = rel_err(a.grad, r.grad)
        kind = str(dtype).split(".")[-1]
        table.add(f"scatter {reduce:4} {kind}", errs, tol, (out,))
        # the segment kernels: the same reduction over sorted indices
        order = index.argsort()
        sidx, ssrc = index[order], src[order]
        ptr = torch.zeros(size + 1, dtype=torch.long, device=dev)
        ptr[1:] = torch.bincount(sidx, minlength=size).cumsum(0)
        if reduce == "min":
            continue
        sref = reference(ssrc.float(), sidx, size, reduce)
        csr = segment_csr(ssrc, ptr, reduce=reduce)
        coo = segment_coo(ssrc, sidx, dim_size=size, reduce=reduce)
        table.add(f"segment {reduce:4} {kind}", {"csr": rel_err(csr, sref),
                                                 "coo": rel_err(coo, sref)}, tol, (csr, coo))
    return table.report()


if __name__ == "__main__":
    sys.exit(main())
