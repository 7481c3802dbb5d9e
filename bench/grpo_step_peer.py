#!/usr/bin/env python3
"""The peer of a Tessera GRPO job on one GPU (examples/grpo-long-*-gpu.yaml): one GRPO
step of the same shape in PyTorch + transformers, the way a single-GPU verl-style loop
runs it:
  - generate: a bf16 copy of the policy, transformers' generate with
    cache_implementation="static" (its decoding forward compiled by transformers itself:
    fullgraph, "reduce-overhead" = CUDA graphs), sampling at temperature 1, exactly --new
    new tokens after random --prompt-len-token prompts, --gen-batch sequences at a time;
  - reference and old-policy log-probs (no grad; the reference a frozen bf16 copy);
  - the update: f32 master weights under bf16 autocast, micro-batches of --micro
    sequences accumulated into one AdamW step; the loss is Tessera's: the clipped
    surrogate on group-normalized advantages plus --kl x k3 KL to the reference,
    token-mean over the step's response tokens;
  - weight sync: the f32 policy copied into the bf16 generation copy.
A warm-up (one --gen-batch generate of the full length, for the compile, and one
micro-batch's forward and backward) runs first; then one timed step. Prints one JSON line with each
phase's seconds, tokens per second and the peak of torch.cuda.max_memory_allocated per
phase.
"""
import argparse
import json
import sys
import time

import torch
import transformers


def now():
    torch.cuda.synchronize()
    return time.perf_counter()


def token_logprobs(model, ids, n_prompt, micro):
    """Per-token log-probs of each sequence's response tokens, micro-batch by micro-batch."""
    out = []
    for i in range(0, ids.shape[0], micro):
        x = ids[i:i + micro]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits[:, n_prompt - 1:-1]
        out.append(torch.log_softmax(logits.float(), -1).gather(-1, x[:, n_prompt:, None]).squeeze(-1))
        del logits
    return torch.cat(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--ffn", type=int, default=6144)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--tied", type=int, default=1)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--group", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--new", type=int, default=1024)
    p.add_argument("--gen-batch", type=int, default=256)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--kl", type=float, default=0.001)
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--flops-per-token", type=float, default=0)  # model FLOPs per token of the update's passes
    a = p.parse_args()
    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab, head_dim=a.head_dim,
        tie_word_embeddings=bool(a.tied), rope_theta=1000000.0, max_position_embeddings=a.prompt_len + a.new + 16)
    torch.manual_seed(0)
    with torch.device("cuda"):
        policy = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
        gen = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
        ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    gen.load_state_dict(policy.state_dict())
    ref.load_state_dict(policy.state_dict())
    gen.eval(), ref.eval(), ref.requires_grad_(False), gen.requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    gc = gen.generation_config
    gc.eos_token_id, gc.pad_token_id = None, 0
    gc.do_sample, gc.temperature, gc.top_k, gc.top_p = True, 1.0, 0, 1.0
    gc.cache_implementation, gc.disable_compile = "static", False
    if hasattr(transformers, "CompileConfig"):
        gc.compile_config = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
    n = a.prompts * a.group
    prompts = torch.randint(0, min(a.vocab, 256), (a.prompts, a.prompt_len), device="cuda").repeat_interleave(a.group, 0)

    if n % a.gen_batch:
        raise SystemExit(f"--gen-batch {a.gen_batch} must divide the {n} samples (one compiled shape)")

    def generate(new, upto=None):
        gc.max_new_tokens = gc.min_new_tokens = new
        outs = []
        with torch.inference_mode():
            for i in range(0, upto or n, a.gen_batch):
                x = prompts[i:i + a.gen_batch]
                outs.append(gen.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gc))
        return torch.cat(outs).clone()

    def update(ids, old, ref_lp, adv, micro_batches=None):
        opt.zero_grad(set_to_none=True)
        tokens = (ids.shape[0] if micro_batches is None else micro_batches * a.micro) * a.new
        for i in range(0, ids.shape[0] if micro_batches is None else micro_batches * a.micro, a.micro):
            x = ids[i:i + a.micro]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = policy(input_ids=x).logits[:, a.prompt_len - 1:-1]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, x[:, a.prompt_len:, None]).squeeze(-1)
            del logits
            ratio = torch.exp(lp - old[i:i + a.micro])
            A = adv[i:i + a.micro, None]
            surrogate = -torch.minimum(ratio * A, torch.clamp(ratio, 1 - a.clip, 1 + a.clip) * A)
            d = ref_lp[i:i + a.micro] - lp
            k3 = torch.exp(d) - d - 1
            ((surrogate + a.kl * k3).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()

    # Warm-up: one generate batch of the full length (the compile is per batch and cache
    # length), and one micro-batch through the update (stepped at lr 0).
    generate(a.new, upto=a.gen_batch)
    x = torch.randint(0, a.vocab, (a.micro, a.prompt_len + a.new), device="cuda")
    zeros = torch.zeros(a.micro, a.new, device="cuda")
    for group in opt.param_groups:  # a step at lr 0: AdamW's states exist from here on, as Tessera's do
        group["lr"] = 0.0
    update(x, zeros, zeros, torch.zeros(a.micro, device="cuda"), micro_batches=1)
    for group in opt.param_groups:
        group["lr"] = a.lr
    opt.zero_grad(set_to_none=True)
    del x, zeros
    torch.cuda.empty_cache()

    r = {"engine": "pytorch+transformers", "samples": n, "new_tokens": a.new, "prompt_len": a.prompt_len,
         "gen_batch": a.gen_batch, "micro": a.micro, "torch": torch.__version__, "transformers": transformers.__version__}
    torch.cuda.reset_peak_memory_stats()
    t0 = now()
    ids = generate(a.new)
    r["generate_s"] = now() - t0
    r["generate_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if ids.shape != (n, a.prompt_len + a.new):
        raise RuntimeError(f"generated {tuple(ids.shape)}, expected {(n, a.prompt_len + a.new)}")
    torch.cuda.empty_cache()  # the static caches go back before training, as a colocated engine's KV cache
    rewards = torch.zeros(n, device="cuda")  # random weights: no answer is right (as Tessera's exact match)
    g = rewards.view(a.prompts, a.group)
    adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)
    torch.cuda.reset_peak_memory_stats()
    t0 = now()
    with torch.no_grad():
        ref_lp = token_logprobs(ref, ids, a.prompt_len, a.micro)
    r["ref_s"] = now() - t0
    t0 = now()
    with torch.no_grad():
        old = token_logprobs(policy, ids, a.prompt_len, a.micro)
    r["old_logprob_s"] = now() - t0
    t0 = now()
    update(ids, old, ref_lp, adv)
    r["actor_update_s"] = now() - t0
    r["update_s"] = r["ref_s"] + r["old_logprob_s"] + r["actor_update_s"]
    r["update_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    t0 = now()
    with torch.no_grad():
        for pg, pp in zip(gen.parameters(), policy.parameters()):
            pg.copy_(pp)
    r["sync_s"] = now() - t0
    tokens = n * (a.prompt_len + a.new)
    r["generate_tokens_per_s"] = n * a.new / r["generate_s"]
    r["train_tokens_per_s"] = tokens / r["update_s"]
    if a.flops_per_token:
        r["update_tflops"] = r["train_tokens_per_s"] * a.flops_per_token / 1e12
    r["samples_per_s"] = n / (r["generate_s"] + r["update_s"] + r["sync_s"])
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
