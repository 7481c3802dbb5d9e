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

With --hf-dir the model is that directory's (e.g. the random Qwen3-1.7B that
bench/random_hf_model.py writes, which the Tessera job loads too: the same weights on both
sides), and with --prompts-jsonl the prompts are the file's first --prompts problems
({"messages", "answer"} lines) through the directory's chat template, left-padded to the
longest (the attention mask and position ids passed to every forward); the reward is the
rule verifier's (the last \\boxed{} of the decoded response equals the answer), timed.
"""
import argparse
import json
import re
import sys
import time

import torch
import transformers


def now():
    torch.cuda.synchronize()
    return time.perf_counter()


def forward_args(ids, mask, i, micro):
    """A micro-batch's inputs: the ids, and for left-padded prompts the mask and positions."""
    x = ids[i:i + micro]
    if mask is None:
        return x, {"input_ids": x}
    m = mask[i:i + micro]
    return x, {"input_ids": x, "attention_mask": m, "position_ids": (m.cumsum(-1) - 1).clamp(min=0)}


def token_logprobs(model, ids, mask, n_prompt, micro):
    """Per-token log-probs of each sequence's response tokens, micro-batch by micro-batch."""
    out = []
    for i in range(0, ids.shape[0], micro):
        x, kw = forward_args(ids, mask, i, micro)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(**kw).logits[:, n_prompt - 1:-1]
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
    p.add_argument("--hf-dir", default="")  # the model (config, weights, tokenizer) from this directory
    p.add_argument("--prompts-jsonl", default="")  # {"messages", "answer"} lines, through --hf-dir's chat template
    a = p.parse_args()
    torch.manual_seed(0)
    if a.hf_dir:
        def load(dtype):
            return transformers.AutoModelForCausalLM.from_pretrained(a.hf_dir, dtype=dtype, attn_implementation="sdpa").cuda()
        policy, gen, ref = load(torch.float32), load(torch.bfloat16), load(torch.bfloat16)
    else:
        cfg = transformers.AutoConfig.for_model(
            "llama", hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
            num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab, head_dim=a.head_dim,
            tie_word_embeddings=bool(a.tied), rope_theta=1000000.0, max_position_embeddings=a.prompt_len + a.new + 16)
        with torch.device("cuda"):
            policy = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
            gen = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
            ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
        gen.load_state_dict(policy.state_dict())
        ref.load_state_dict(policy.state_dict())
    vocab = policy.config.vocab_size
    gen.eval(), ref.eval(), ref.requires_grad_(False), gen.requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    gc = gen.generation_config
    gc.eos_token_id, gc.pad_token_id = None, 0
    gc.do_sample, gc.temperature, gc.top_k, gc.top_p = True, 1.0, 0, 1.0
    gc.cache_implementation, gc.disable_compile = "static", False
    if hasattr(transformers, "CompileConfig"):
        gc.compile_config = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
    n = a.prompts * a.group
    tok, answers, prompt_mask = None, None, None
    if a.prompts_jsonl:
        tok = transformers.AutoTokenizer.from_pretrained(a.hf_dir)
        lines = [json.loads(l) for l in open(a.prompts_jsonl) if l.strip()][:a.prompts]
        if len(lines) < a.prompts:
            raise SystemExit(f"{a.prompts_jsonl}: {len(lines)} problems, --prompts {a.prompts}")
        texts = [tok.apply_chat_template(l["messages"], tokenize=False, add_generation_prompt=True) for l in lines]
        enc = tok(texts, padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
        prompts = enc.input_ids.cuda().repeat_interleave(a.group, 0)
        prompt_mask = enc.attention_mask.cuda().repeat_interleave(a.group, 0)
        answers = [l["answer"] for l in lines for _ in range(a.group)]
        gc.pad_token_id = tok.pad_token_id
        a.prompt_len = prompts.shape[1]
    else:
        prompts = torch.randint(0, min(vocab, 256), (a.prompts, a.prompt_len), device="cuda").repeat_interleave(a.group, 0)

    if n % a.gen_batch:
        raise SystemExit(f"--gen-batch {a.gen_batch} must divide the {n} samples (one compiled shape)")

    class StopAfter(transformers.StoppingCriteria):
        """Ends a warm-up generate after `steps` tokens: the cache and the compiled graphs
        are those of the full length, the time is not."""
        def __init__(self, steps):
            self.steps, self.seen = steps, 0

        def __call__(self, input_ids, scores, **kwargs):
            self.seen += 1
            return torch.full((input_ids.shape[0],), self.seen >= self.steps, dtype=torch.bool, device=input_ids.device)

    def generate(new, upto=None, warm_steps=0):
        gc.max_new_tokens = gc.min_new_tokens = new
        outs = []
        with torch.inference_mode():
            for i in range(0, upto or n, a.gen_batch):
                x = prompts[i:i + a.gen_batch]
                m = torch.ones_like(x) if prompt_mask is None else prompt_mask[i:i + a.gen_batch]
                extra = {"stopping_criteria": transformers.StoppingCriteriaList([StopAfter(warm_steps)])} if warm_steps else {}
                outs.append(gen.generate(input_ids=x, attention_mask=m, generation_config=gc, **extra))
        return torch.cat(outs).clone()

    def update(ids, mask, old, ref_lp, adv, micro_batches=None):
        opt.zero_grad(set_to_none=True)
        tokens = (ids.shape[0] if micro_batches is None else micro_batches * a.micro) * a.new
        for i in range(0, ids.shape[0] if micro_batches is None else micro_batches * a.micro, a.micro):
            x, kw = forward_args(ids, mask, i, a.micro)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = policy(**kw).logits[:, a.prompt_len - 1:-1]
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

    # Warm-up: one generate batch with the full length's cache (the compile is per batch
    # and cache length), stopped after 32 tokens, and one micro-batch through the update
    # (stepped at lr 0).
    generate(a.new, upto=a.gen_batch, warm_steps=32)
    x = torch.randint(0, vocab, (a.micro, a.prompt_len + a.new), device="cuda")
    zeros = torch.zeros(a.micro, a.new, device="cuda")
    for group in opt.param_groups:  # a step at lr 0: AdamW's states exist from here on, as Tessera's do
        group["lr"] = 0.0
    update(x, None, zeros, zeros, torch.zeros(a.micro, device="cuda"), micro_batches=1)
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
    mask = None
    t0 = now()
    if tok is not None:
        mask = torch.cat([prompt_mask, torch.ones_like(ids[:, a.prompt_len:])], 1)
        rewards = []
        for text, answer in zip(tok.batch_decode(ids[:, a.prompt_len:].tolist(), skip_special_tokens=True), answers):
            boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
            rewards.append(1.0 if boxed and boxed[-1].strip() == answer else 0.0)
        rewards = torch.tensor(rewards, device="cuda")
    else:
        rewards = torch.zeros(n, device="cuda")  # random weights: no answer is right (as Tessera's exact match)
    r["reward_s"] = now() - t0
    r["reward"] = rewards.mean().item()
    g = rewards.view(a.prompts, a.group)
    adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)
    torch.cuda.reset_peak_memory_stats()
    t0 = now()
    with torch.no_grad():
        ref_lp = token_logprobs(ref, ids, mask, a.prompt_len, a.micro)
    r["ref_s"] = now() - t0
    t0 = now()
    with torch.no_grad():
        old = token_logprobs(policy, ids, mask, a.prompt_len, a.micro)
    r["old_logprob_s"] = now() - t0
    t0 = now()
    update(ids, mask, old, ref_lp, adv)
    r["actor_update_s"] = now() - t0
    r["update_s"] = r["ref_s"] + r["old_logprob_s"] + r["actor_update_s"]
    r["update_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    t0 = now()
    with torch.no_grad():
        for pg, pp in zip(gen.parameters(), policy.parameters()):
            pg.copy_(pp)
    r["sync_s"] = now() - t0
    r["sync_gb_per_s"] = sum(t.numel() * t.element_size() for t in gen.parameters()) / r["sync_s"] / 1e9
    tokens = n * (a.prompt_len + a.new) if mask is None else int(mask.sum().item())  # without the padding
    r["prompt_tokens_mean"] = (tokens - n * a.new) / n
    r["generate_tokens_per_s"] = n * a.new / r["generate_s"]
    r["train_tokens_per_s"] = tokens / r["update_s"]
    if a.flops_per_token:
        r["update_tflops"] = r["train_tokens_per_s"] * a.flops_per_token / 1e12
    r["step_s"] = r["generate_s"] + r["reward_s"] + r["update_s"] + r["sync_s"]
    r["samples_per_s"] = n / r["step_s"]
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
