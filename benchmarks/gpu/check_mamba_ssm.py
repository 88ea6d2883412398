"""Correctness of an installed mamba-ssm's selective scan against plain PyTorch (needs a GPU).

The compiled extension (``selective_scan_cuda``, forward and backward) against the selective
scan written out in float32 PyTorch: x_t = exp(delta_t A) x_{t-1} + delta_t B_t u_t,
y_t = C_t x_t + D u_t, times silu(z), with delta = softplus(delta + bias); all gradients
(du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) through autograd of the reference. Also
``selective_scan_fn`` and the package's own ``selective_scan_ref`` when mamba_ssm imports (it
needs triton and transformers; the extension itself needs torch only).

    python benchmarks/gpu/check_mamba_ssm.py
"""

from __future__ import annotations

import itertools
import sys

import torch
import torch.nn.functional as F
from gpu_check import Table, device_line, rel_err


def reference(u, delta, A, B, C, D, z, delta_bias):  # type: ignore[no-untyped-def]
    """The selective scan, real A, input-dependent B and C (batch, dstate, seqlen)."""
    delta = F.softplus(delta + delta_bias[:, None])
    x = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    ys = []
    for t in range(u.shape[2]):
        x = deltaA[:, :, t] * x + deltaB_u[:, :, t]
        ys.append(torch.einsum("bdn,bn->bd", x, C[:, :, t]))
    y = torch.stack(ys, dim=2) + u * D[:, None]
    return y * F.silu(z)


class Kernel(torch.autograd.Function):
    """selective_scan_cuda.fwd/bwd, as mamba_ssm's SelectiveScanFn calls them (B, C grouped)."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias):  # type: ignore[no-untyped-def]
        import selective_scan_cuda

        B4, C4 = B.unsqueeze(1), C.unsqueeze(1)
        out, x, *rest = selective_scan_cuda.fwd(u, delta, A, B4, C4, D, z, delta_bias, True)
        ctx.save_for_backward(u, delta, A, B4, C4, D, z, delta_bias, x, out)
        return rest[0]

    @staticmethod
    def backward(ctx, dout):  # type: ignore[no-untyped-def]
        import selective_scan_cuda

        u, delta, A, B4, C4, D, z, delta_bias, x, out = ctx.saved_tensors
        du, ddelta, dA, dB, dC, dD, ddelta_bias, dz, *_ = selective_scan_cuda.bwd(
            u, delta, A, B4, C4, D, z, delta_bias, dout.contiguous(), x, out, None, True, False)
        return du, ddelta, dA, dB.squeeze(1), dC.squeeze(1), dD, dz, ddelta_bias


def main() -> int:
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn, selective_scan_ref
    except ImportError as exc:
        print(f"mamba_ssm does not import here ({exc}); checking the extension alone")
        selective_scan_fn = selective_scan_ref = None
    torch.manual_seed(0)
    dev = "cuda"
    table = Table(f"mamba-ssm selective_scan_cuda, {device_line()}")
    batch, dim, dstate = 2, 64, 16
    names = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "dbias")
    for dtype, seqlen in itertools.product((torch.float32, torch.float16, torch.bfloat16),
                                           (128, 512, 2048)):
        u = torch.randn(batch, dim, seqlen, device=dev, dtype=dtype)
        delta = 0.5 * torch.rand(batch, dim, seqlen, device=dev, dtype=dtype)
        z = torch.randn(batch, dim, seqlen, device=dev, dtype=dtype)
        A = -0.5 * torch.rand(dim, dstate, device=dev)
        B = torch.randn(batch, dstate, seqlen, device=dev, dtype=dtype)
        C = torch.randn(batch, dstate, seqlen, device=dev, dtype=dtype)
        D = torch.randn(dim, device=dev)
        delta_bias = 0.5 * torch.rand(dim, device=dev)
        dout = torch.randn(batch, dim, seqlen, device=dev, dtype=dtype)
        ins = [t.clone().requires_grad_(True) for t in (u, delta, A, B, C, D, z, delta_bias)]
        out = Kernel.apply(*ins)
        out.backward(dout)
        refs = [t.detach().float().requires_grad_(True) for t in (u, delta, A, B, C, D, z,
                                                                   delta_bias)]
        ref = reference(*refs)
        ref.backward(dout.float())
        tol = 5e-4 if dtype == torch.float32 else 3e-2
        errs = {"out": rel_err(out, ref)}
        errs.update({n: rel_err(a.grad, r.grad) for n, a, r in zip(names, ins, refs, strict=True)})
        kind = str(dtype).split(".")[-1]
        table.add(f"kernel {kind:8} L {seqlen:4}", errs, tol, (out, *(t.grad for t in ins)))
        if selective_scan_fn is not None and selective_scan_ref is not None:
            fn = selective_scan_fn(u, delta, A, B, C, D, z=z, delta_bias=delta_bias,
                                   delta_softplus=True)
            pkg_ref = selective_scan_ref(*refs[:6], z=refs[6], delta_bias=refs[7],
                                         delta_softplus=True)
            table.add(f"fn     {kind:8} L {seqlen:4}",
                      {"out": rel_err(fn, ref), "pkg_ref": rel_err(pkg_ref, ref)}, tol, (fn,))
    return table.report()


if __name__ == "__main__":
    sys.exit(main())
