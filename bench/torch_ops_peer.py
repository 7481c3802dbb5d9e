"""Peer for bench/op_bench: the same ops and shapes in PyTorch (eager and
torch.compile), timed with CUDA events after warm-up. Prints one JSON line per case.
With --memory-only: the memory-bound ops and the device copy only (no GEMM, attention);
with --attention-only: attention only."""
import json
import sys
import torch
import torch.nn.functional as F

torch.manual_seed(0)
dev = "cuda"
bf = torch.bfloat16


def time_ms(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters


def line(op, variant, shape, ms, unit, value):
    print(json.dumps({"op": op, "variant": variant, "shape": shape, "ms": round(ms, 4), unit: round(value, 2)}), flush=True)


def attention():
    # Attention: 16384 tokens packed as B sequences of S, [B, S, H, D] viewed as [B, H, S, D]
    # (the same memory layout as Tessera's [T, H, D]); each SDPA backend forced in turn.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    BACKENDS = (("FLASH", SDPBackend.FLASH_ATTENTION), ("CUDNN", SDPBackend.CUDNN_ATTENTION),
                ("EFFICIENT", SDPBackend.EFFICIENT_ATTENTION))
    for D, H in ((64, 32), (128, 16)):
        for S in (1024, 4096, 16384):
            B = 16384 // S
            q, k, v, g = (torch.randn(B, S, H, D, device=dev, dtype=bf).transpose(1, 2) for _ in range(4))
            for causal in (True, False):
                flops = 4.0 * B * S * S * H * D * (0.5 if causal else 1.0)
                shape = f"B{B} S{S} H{H} D{D} {'causal' if causal else 'full'}"
                for bname, backend in BACKENDS:
                    try:
                        with sdpa_kernel(backend):
                            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            ms = time_ms(fwd, iters=10)
                            line(f"attn_fwd d{D} s{S} {'c' if causal else 'n'}", bname, shape, ms, "tflops", flops / ms / 1e9)
                            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

                            def fwd_bwd():
                                F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(g)

                            ms = time_ms(fwd_bwd, iters=10)
                            line(f"attn_fwdbwd d{D} s{S} {'c' if causal else 'n'}", bname, shape, ms, "tflops",
                                 3.5 * flops / ms / 1e9)
                    except RuntimeError as e:  # a backend that does not take this shape
                        print(json.dumps({"skip": bname, "shape": shape, "why": str(e)[:120]}), flush=True)
            del q, k, v, g


if "--attention-only" in sys.argv:
    attention()
    sys.exit(0)


def rmsnorm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(bf) * w


def swiglu(g, u):
    return F.silu(g) * u


r, c = 16384, 2048
x, w = torch.randn(r, c, device=dev, dtype=bf), torch.randn(c, device=dev, dtype=bf)
for name, fn in (("eager", rmsnorm), ("compile", torch.compile(rmsnorm))):
    ms = time_ms(lambda: fn(x, w))
    line("rmsnorm_fwd", name, "16384x2048 bf16", ms, "gbps", (2.0 * r * c * 2 + r * 4) / ms / 1e6)


def rmsnorm_bwd(x, w, rstd, dy):
    xf, gf = x.float(), dy.float()
    xhat = xf * rstd[:, None]
    dw = (gf * xhat).sum(0)
    gw = gf * w.float()
    dx = rstd[:, None] * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
    return dx.to(bf), dw


rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-5)
dyr = torch.randn(r, c, device=dev, dtype=bf)
for name, fn in (("eager", rmsnorm_bwd), ("compile", torch.compile(rmsnorm_bwd))):
    ms = time_ms(lambda: fn(x, w, rstd, dyr))
    line("rmsnorm_bwd", name, "16384x2048 bf16", ms, "gbps", (3.0 * r * c * 2 + r * 4 + c * 6) / ms / 1e6)
del dyr
n = 16384 * 8192
g, u = torch.randn(n, device=dev, dtype=bf), torch.randn(n, device=dev, dtype=bf)
for name, fn in (("eager", swiglu), ("compile", torch.compile(swiglu))):
    ms = time_ms(lambda: fn(g, u))
    line("swiglu_fwd", name, "16384x8192 bf16", ms, "gbps", 3.0 * n * 2 / ms / 1e6)


def swiglu_bwd(dy, g, u):
    gf, uf, df = g.float(), u.float(), dy.float()
    s = torch.sigmoid(gf)
    return (df * uf * s * (1 + gf * (1 - s))).to(bf), (df * gf * s).to(bf)


dys = torch.randn(n, device=dev, dtype=bf)
for name, fn in (("eager", swiglu_bwd), ("compile", torch.compile(swiglu_bwd))):
    ms = time_ms(lambda: fn(dys, g, u))
    line("swiglu_bwd", name, "16384x8192 bf16", ms, "gbps", 5.0 * n * 2 / ms / 1e6)
del g, u, x, dys
T, H, D = 16384, 32, 64
xr = torch.randn(T, H, D, device=dev, dtype=bf)
inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
ang = torch.arange(T, device=dev, dtype=torch.float32)[:, None] * inv[None, :]
cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].to(bf)
sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :].to(bf)


def rope(x, cos, sin):
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


for name, fn in (("eager", rope), ("compile", torch.compile(rope))):
    ms = time_ms(lambda: fn(xr, cos, sin))
    line("rope", name, "16384x32x64 bf16 (cos/sin precomputed)", ms, "gbps", (2.0 * T * H * D * 2 + T * 4) / ms / 1e6)
del xr
nz, vz = 4096, 128256
zl = torch.randn(nz, vz, device=dev, dtype=bf)
tz = torch.randint(0, vz, (nz,), device=dev)


def ce(z, t):
    return F.cross_entropy(z.float(), t, reduction="none")


for name, fn in (("eager", ce), ("compile", torch.compile(ce))):
    ms = time_ms(lambda: fn(zl, tz))
    line("cross_entropy_fwd", name, "4096x128256 bf16", ms, "gbps", 1.0 * nz * vz * 2 / ms / 1e6)


def ce_bwd(z, t, lse, dl):
    p = torch.exp(z.float() - lse[:, None])
    p[torch.arange(z.shape[0], device=z.device), t] -= 1.0
    return (p * dl[:, None]).to(bf)


lsez = torch.logsumexp(zl.float(), -1)
dlz = torch.randn(nz, device=dev)
for name, fn in (("eager", ce_bwd), ("compile", torch.compile(ce_bwd))):
    ms = time_ms(lambda: fn(zl, tz, lsez, dlz))
    line("cross_entropy_bwd", name, "4096x128256 bf16", ms, "gbps", 2.0 * nz * vz * 2 / ms / 1e6)
del zl
n = 256 << 20
p = torch.nn.Parameter(torch.randn(n, device=dev))
p.grad = torch.randn(n, device=dev)  # fused AdamW wants grads in the param dtype
opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
ms = time_ms(lambda: opt.step())
line("adamw", "torch fused", "256M f32 (f32 grad, no bf16 out)", ms, "gbps", (4.0 * 4 + 4 * 3) * n / ms / 1e6)
del p, opt
copy_src = torch.empty(1 << 30, device=dev, dtype=torch.uint8)
copy_dst = torch.empty_like(copy_src)
ms = time_ms(lambda: copy_dst.copy_(copy_src))
line("device_copy", "torch", "1 GiB", ms, "gbps", 2.0 * (1 << 30) / ms / 1e6)
del copy_src, copy_dst
if "--memory-only" in sys.argv:
    sys.exit(0)
for name, m, nn, k in (("gemm_qkv", 8192, 3072, 2048), ("gemm_o", 8192, 2048, 2048), ("gemm_gate_up", 8192, 16384, 2048),
                       ("gemm_down", 8192, 2048, 8192), ("gemm_lm_head", 8192, 128256, 2048)):
    a = torch.randn(m, k, device=dev, dtype=bf)
    wt = torch.randn(nn, k, device=dev, dtype=bf) * 0.02
    ms = time_ms(lambda: torch.matmul(a, wt.t()))
    line(name, "torch.matmul", f"{m}x{nn}x{k} bf16", ms, "tflops", 2.0 * m * nn * k / ms / 1e9)
attention()
