"""Correctness of an installed causal-conv1d against plain PyTorch (needs a CUDA GPU).

causal_conv1d_fn (forward and backward: dx, dweight, dbias) against a depthwise F.conv1d padded
on the left (computed in float32 on the same inputs), with and without SiLU, fp32/fp16/bf16,
widths 2-4; causal_conv1d_update (one decoding step) against the same conv on the rolled state.

    python benchmarks/gpu/check_causal_conv1d.py
"""

from __future__ import annotations

import itertools
import sys

import torch
import torch.nn.functional as F
from gpu_check import Table, device_line, rel_err


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
              silu: bool) -> torch.Tensor:
    width = weight.shape[1]
    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=width - 1, groups=x.shape[1])
    out = out[..., : x.shape[-1]]
    return F.silu(out) if silu else out


def main() -> int:
    import causal_conv1d
    from causal_conv1d import causal_conv1d_fn, causal_conv1d_update

    torch.manual_seed(0)
    dev = "cuda"
    table = Table(f"causal-conv1d {causal_conv1d.__version__}, {device_line()}")
    batch, dim, seqlen = 2, 256, 1024
    for dtype, width, silu in itertools.product(
        (torch.float32, torch.float16, torch.bfloat16), (2, 3, 4), (False, True)
    ):
        x = torch.randn(batch, dim, seqlen, device=dev, dtype=dtype, requires_grad=True)
        w = torch.randn(dim, width, device=dev, dtype=torch.float32, requires_grad=True)
        b = torch.randn(dim, device=dev, dtype=torch.float32, requires_grad=True)
        dout = torch.randn(batch, dim, seqlen, device=dev, dtype=dtype)
        out = causal_conv1d_fn(x, w, b, activation="silu" if silu else None)
        out.backward(dout)
        xr, wr, br = (t.detach().float().requires_grad_(True) for t in (x, w, b))
        ref = reference(xr, wr, br, silu)
        ref.backward(dout.float())
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        errs = {"out": rel_err(out, ref), "dx": rel_err(x.grad, xr.grad),
                "dw": rel_err(w.grad, wr.grad), "db": rel_err(b.grad, br.grad)}
        name = f"fn {str(dtype).split('.')[-1]:8} width {width} silu {str(silu):5}"
        table.add(name, errs, tol, (out, x.grad, w.grad))
    for dtype in (torch.float32, torch.bfloat16):
        width = 4
        state = torch.randn(batch, dim, width - 1, device=dev, dtype=dtype)
        x = torch.randn(batch, dim, device=dev, dtype=dtype)
        w = torch.randn(dim, width, device=dev, dtype=torch.float32)
        b = torch.randn(dim, device=dev, dtype=torch.float32)
        window = torch.cat([state, x.unsqueeze(-1)], dim=-1).float()
        ref = F.silu((window * w).sum(-1) + b)
        out = causal_conv1d_update(x, state.clone(), w, b, activation="silu")
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        table.add(f"update {str(dtype).split('.')[-1]}", {"out": rel_err(out, ref)}, tol, (out,))
    return table.report()


if __name__ == "__main__":
    sys.exit(main())
