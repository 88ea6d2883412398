"""Correctness of an installed flash-attn against torch's SDPA (needs a CUDA GPU).

Forward and backward, bf16 and fp16, head dims 64/128/256, causal and not. The reference is
SDPA computed in float32 on the same (upcast) inputs; flash-attn runs in the low precision.
Prints a table and exits non-zero on any failure.

    python benchmarks/gpu/check_flash_attn.py
"""

from __future__ import annotations

import itertools
import sys

import torch
import torch.nn.functional as F


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def main() -> int:
    from flash_attn import __version__ as fa_version
    from flash_attn import flash_attn_func

    torch.manual_seed(0)
    dev = "cuda"
    batch, seqlen, heads = 2, 512, 8
    rows = []
    failed = 0
    for dtype, hdim, causal in itertools.product((torch.bfloat16, torch.float16), (64, 128, 256), (False, True)):
        # fresh random inputs per case; layout (batch, seqlen, heads, hdim) as flash-attn takes it
        q, k, v = (torch.randn(batch, seqlen, heads, hdim, device=dev, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn(batch, seqlen, heads, hdim, device=dev, dtype=dtype)
        out = flash_attn_func(q, k, v, causal=causal)
        out.backward(dout)
        dq, dk, dv = q.grad, k.grad, v.grad

        qr, kr, vr = (t.detach().float().transpose(1, 2).requires_grad_(True) for t in (q, k, v))
        ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
        ref.backward(dout.float().transpose(1, 2))
        ref_out = ref.transpose(1, 2)
        errs = {
            "out": rel_err(out, ref_out),
            "dq": rel_err(dq, qr.grad.transpose(1, 2)),
            "dk": rel_err(dk, kr.grad.transpose(1, 2)),
            "dv": rel_err(dv, vr.grad.transpose(1, 2)),
        }
        # bf16 operands land between 1e-3 and 1e-2 relative error; fp16 lower.
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-2
        nan = any(torch.isnan(t).any().item() for t in (out, dq, dk, dv))
        ok = not nan and all(e < tol for e in errs.values())
        failed += not ok
        rows.append((str(dtype).split(".")[-1], hdim, causal, errs, tol, "ok" if ok else "FAIL"))
    print(f"flash-attn {fa_version}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'dtype':9} {'hdim':>4} {'causal':>6} {'out':>9} {'dq':>9} {'dk':>9} {'dv':>9} {'tol':>6}  result")
    for dt, hd, ca, e, tol, res in rows:
        print(f"{dt:9} {hd:4d} {str(ca):>6} {e['out']:9.2e} {e['dq']:9.2e} {e['dk']:9.2e} {e['dv']:9.2e} {tol:6.0e}  {res}")
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
