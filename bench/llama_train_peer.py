#!/usr/bin/env python3
"""PyTorch peer of bench/train_bench.cc: the same Llama (RMSNorm, RoPE, GQA, SwiGLU, tied
embeddings unless --tied 0; --head-dim, Qwen3's --qk-norm 1, Qwen2's --qkv-bias 1), fp32 master weights under torch.autocast(bf16), F.scaled_dot_product_attention
with the backend forced, torch.compile (default mode), fused AdamW, gradient accumulation
over `--micro` micro-batches of `--mbs` (default 1) `--seq`-token sequences per rank. Same FLOP formula as
the engine (6 N per token + causal attention 6 L Hq D s^2). One JSON line per variant.

Under torchrun (WORLD_SIZE > 1), `--parallel ddp` wraps the compiled model in DDP
(bucketed all-reduce overlapped with backward, no_sync until the last micro-batch) and
`--parallel fsdp2` shards every block and the root with fully_shard (bf16 params, f32
gradient reduction: MixedPrecisionPolicy; reduce-scatter every micro-batch, as the
engine's ZeRO-3). Rank 0 prints; tokens/s count every rank's tokens."""
import argparse, contextlib, json, math, os, time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Block(nn.Module):
    def __init__(s, h, heads, kv, ffn, d, qk_norm, bias):
        super().__init__()
        s.heads, s.kv, s.d = heads, kv, d
        s.n1, s.n2 = nn.RMSNorm(h, eps=1e-5), nn.RMSNorm(h, eps=1e-5)
        s.q = nn.Linear(h, heads * s.d, bias=bias)
        s.k = nn.Linear(h, kv * s.d, bias=bias)
        s.v = nn.Linear(h, kv * s.d, bias=bias)
        s.qn, s.kn = (nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)) if qk_norm else (None, None)
        s.o = nn.Linear(heads * s.d, h, bias=False)
        s.g = nn.Linear(h, ffn, bias=False)
        s.u = nn.Linear(h, ffn, bias=False)
        s.dn = nn.Linear(ffn, h, bias=False)

    def forward(s, x, cos, sin):
        b, t, _ = x.shape
        y = s.n1(x)
        q = s.q(y).view(b, t, s.heads, s.d)
        k = s.k(y).view(b, t, s.kv, s.d)
        if s.qn is not None:  # Qwen3: each head's RMSNorm before RoPE
            q, k = s.qn(q), s.kn(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = s.v(y).view(b, t, s.kv, s.d).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + s.o(a.transpose(1, 2).reshape(b, t, -1))
        y = s.n2(x)
        return x + s.dn(F.silu(s.g(y)) * s.u(y))


def rope(x, cos, sin):  # rotate-half (Hugging Face Llama)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Llama(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.emb = nn.Embedding(a.vocab, a.hidden)
        d = a.head_dim or a.hidden // a.heads
        s.blocks = nn.ModuleList(Block(a.hidden, a.heads, a.kv_heads, a.ffn, d, a.qk_norm, a.qkv_bias)
                                 for _ in range(a.layers))
        s.norm = nn.RMSNorm(a.hidden, eps=1e-5)
        s.head = None if a.tied else nn.Linear(a.hidden, a.vocab, bias=False)
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2).float() / d))
        f = torch.outer(torch.arange(a.seq).float(), inv)
        emb = torch.cat((f, f), dim=-1)
        s.register_buffer("cos", emb.cos()[None, None], persistent=False)
        s.register_buffer("sin", emb.sin()[None, None], persistent=False)
        for p in s.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(s, tokens, targets):
        x = s.emb(tokens)
        for b in s.blocks:
            x = b(x, s.cos, s.sin)
        logits = F.linear(s.norm(x), s.emb.weight) if s.head is None else s.head(s.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1)


def run(a, backend, compiled):
    torch.manual_seed(0)
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    model = Llama(a).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    autocast = True
    if a.parallel == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for b in model.blocks:
            fully_shard(b, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        autocast = False
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if compiled else model
    if a.parallel == "ddp":
        fwd = torch.nn.parallel.DistributedDataParallel(fwd, device_ids=[torch.cuda.current_device()])
    g = torch.Generator(device="cuda").manual_seed(11 + rank)
    toks = torch.randint(0, a.vocab, (a.micro, a.mbs, a.seq), device="cuda", generator=g)
    tgts = torch.cat([toks[:, :, 1:], torch.full((a.micro, a.mbs, 1), -1, device="cuda")], dim=2)
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in range(a.micro):
            sync = a.parallel != "ddp" or i == a.micro - 1
            ctx = contextlib.nullcontext() if sync else fwd.no_sync()
            with ctx:
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast), sdpa_kernel([backend]):
                    loss = fwd(toks[i], tgts[i]) / a.micro
                loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(total)  # host sync, as the engine's step

    for _ in range(a.warmup):
        losses.append(step())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        losses.append(step())
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    tokens = a.steps * a.micro * a.mbs * a.seq * world
    d = a.head_dim or a.hidden // a.heads
    flops = 6.0 * n_params * tokens + 6.0 * a.layers * a.heads * d * a.seq * a.seq * a.micro * a.mbs * a.steps * world
    name = f"{'compile' if compiled else 'eager'}+{backend.name}" + (f" {a.parallel}x{world}" if world > 1 else "")
    return {"impl": "torch", "variant": name, "params": n_params, "tflops_per_gpu": flops / secs / 1e12 / world,
            "seq": a.seq, "mbs": a.mbs, "micro": a.micro, "steps": a.steps, "step_ms": 1e3 * secs / a.steps,
            "tokens_per_s": tokens / secs, "tflops": flops / secs / 1e12,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "losses": [round(l, 4) for l in losses]}


def main():
    p = argparse.ArgumentParser()
    for k, d in [("hidden", 2048), ("layers", 16), ("heads", 32), ("kv-heads", 8), ("ffn", 8192), ("vocab", 128256),
                 ("seq", 4096), ("mbs", 1), ("micro", 4), ("steps", 10), ("warmup", 3), ("head-dim", 0),
                 ("qk-norm", 0), ("qkv-bias", 0), ("tied", 1)]:
        p.add_argument("--" + k, type=int, default=d)
    p.add_argument("--variants", default="compile+FLASH_ATTENTION,compile+CUDNN_ATTENTION")
    p.add_argument("--parallel", default="none", choices=["none", "ddp", "fsdp2"])
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rank = int(os.environ.get("RANK", 0))
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.distributed.init_process_group("nccl")
    for v in a.variants.split(","):
        mode, backend = v.split("+")
        try:
            r = run(a, getattr(SDPBackend, backend), mode == "compile")
        except Exception as e:  # a backend that does not support the shape: say so, go on
            r = {"impl": "torch", "variant": v + " " + a.parallel, "error": str(e)[:300]}
        if rank == 0:
            print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
