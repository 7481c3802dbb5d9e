#!/usr/bin/env python3
"""The peer of bench/decode_bench.cc: transformers' generate on the same Llama / Qwen2 /
Qwen3 shape
(random weights, bf16, SDPA), greedy, exactly --new new tokens after --prompt random
tokens, for each batch size. Two modes:
  eager    - the default dynamic cache, no compilation;
  compiled - cache_implementation="static", whose decoding forward transformers
             compiles itself (compile_config: fullgraph, mode="reduce-overhead", i.e.
             CUDA graphs), the setup transformers documents for fast generation.
As decode_bench: one warm-up (compiled: three, for the prefill and decode graphs), then the
best of --reps whole generate() calls, and the same with one new token, so that
decode_ms_per_step = (t(new) - t(1)) / (new - 1). One JSON line per (mode, batch).

With --rl-prompts P, the RL-scale run of decode_bench --rl-prompts: P prompts of random
lengths in [--prompt-min, --prompt-max] (left-padded into one batch), sampled at
temperature 1 for up to --new tokens, ending at any of --stops stop tokens (the same ids
as decode_bench's), in one generate() call per mode — transformers' own batching: a
finished row waits (padded) for the batch's longest. Counted: each row's tokens up to and
including its first stop token. One warm-up call, then one timed.
"""
import argparse
import json
import sys
import time

import torch
import transformers


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def set_mode(gc, mode):
    if mode == "compiled":
        # transformers >= 4.48 compiles the decoding forward itself for a static cache
        # (GenerationConfig.compile_config: fullgraph, "reduce-overhead" = CUDA graphs);
        # wrapping model.forward by hand as well broke its CUDA-graph bookkeeping (5.17).
        gc.cache_implementation = "static"
        gc.disable_compile = False
        if hasattr(transformers, "CompileConfig"):
            gc.compile_config = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
    else:
        gc.cache_implementation = None
        gc.disable_compile = True


def rl_scale(a, model, gc):
    g = torch.Generator().manual_seed(17)
    lens = torch.randint(a.prompt_min, a.prompt_max + 1, (a.rl_prompts,), generator=g)
    width = int(lens.max())
    ids = torch.zeros(a.rl_prompts, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lens.tolist()):  # left padding, as generate() wants for a decoder
        ids[i, width - n:] = torch.randint(0, a.vocab, (n,), generator=g)
        mask[i, width - n:] = 1
    ids, mask = ids.cuda(), mask.cuda()
    stops = [i * (a.vocab // a.stops) + 7 for i in range(a.stops)]
    gc.eos_token_id = stops
    gc.pad_token_id = 0
    gc.do_sample, gc.temperature, gc.top_k, gc.top_p = True, 1.0, 0, 1.0
    gc.max_new_tokens, gc.min_new_tokens = a.new, None
    stop_set = torch.tensor(stops, device="cuda")
    for mode in a.modes.split(","):
        set_mode(gc, mode)
        try:
            def gen():
                with torch.inference_mode():
                    return model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
            gen()  # warm-up (compiles)
            seconds, out = timed(gen)
            new = out[:, width:]
            is_stop = torch.isin(new, stop_set)
            first = torch.where(is_stop.any(1), is_stop.int().argmax(1) + 1, torch.full_like(is_stop[:, 0], new.shape[1], dtype=torch.long))
            generated = int(first.sum())
            print(json.dumps({"engine": f"transformers-{mode}", "mode": "rl", "prompts": a.rl_prompts, "max_new": a.new,
                              "generated": generated, "seconds": round(seconds, 3),
                              "tokens_per_s": round(generated / seconds, 1), "mean_new": round(generated / a.rl_prompts, 1),
                              "steps": int(new.shape[1]), "transformers": transformers.__version__}), flush=True)
        except Exception as e:
            print(json.dumps({"engine": f"transformers-{mode}", "mode": "rl", "error": repr(e)[:400]}), flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--batch", default="1,64")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--head-dim", type=int, default=0)  # 0: hidden / heads
    p.add_argument("--qk-norm", type=int, default=0)   # 1: Qwen3 (transformers' Qwen3ForCausalLM)
    p.add_argument("--qkv-bias", type=int, default=0)  # 1: Qwen2 (Qwen2ForCausalLM)
    p.add_argument("--tied", type=int, default=1)
    p.add_argument("--rl-prompts", type=int, default=0)
    p.add_argument("--prompt-min", type=int, default=64)
    p.add_argument("--prompt-max", type=int, default=512)
    p.add_argument("--stops", type=int, default=128)
    a = p.parse_args()
    family = "qwen3" if a.qk_norm else "qwen2" if a.qkv_bias else "llama"
    cfg = transformers.AutoConfig.for_model(
        family, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
        head_dim=a.head_dim or a.hidden // a.heads, tie_word_embeddings=bool(a.tied), rope_theta=500000.0,
        max_position_embeddings=max(2048, max(a.prompt, a.prompt_max) + a.new + 16))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    gc = model.generation_config
    gc.eos_token_id = None
    gc.pad_token_id = 0
    gc.do_sample = False
    if a.rl_prompts:
        return rl_scale(a, model, gc)
    for mode in a.modes.split(","):
        set_mode(gc, mode)
        for batch in [int(b) for b in a.batch.split(",")]:
            ids = torch.randint(0, a.vocab, (batch, a.prompt), device="cuda", generator=None)
            mask = torch.ones_like(ids)

            def gen(n):
                with torch.inference_mode():
                    gc.max_new_tokens = gc.min_new_tokens = n
                return model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
            try:
                for _ in range(3 if mode == "compiled" else 1):
                    gen(a.new)
                    gen(1)
                full, out = min((timed(lambda: gen(a.new)) for _ in range(a.reps)), key=lambda x: x[0])
                one, _ = min((timed(lambda: gen(1)) for _ in range(a.reps)), key=lambda x: x[0])
                new = out.shape[1] - a.prompt
                if new != a.new:
                    raise RuntimeError(f"generated {new} tokens, expected {a.new}")
                step_ms = (full - one) * 1e3 / (a.new - 1)
                print(json.dumps({"engine": f"transformers-{mode}", "batch": batch, "prompt": a.prompt, "new": a.new,
                                  "seconds": round(full, 4), "tokens_per_s": round(batch * a.new / full, 1),
                                  "prefill_ms": round(one * 1e3, 2), "decode_ms_per_step": round(step_ms, 3),
                                  "decode_tokens_per_s": round(batch * 1e3 / step_ms, 1),
                                  "transformers": transformers.__version__, "torch": torch.__version__}), flush=True)
            except Exception as e:  # report and go on with the next configuration
                print(json.dumps({"engine": f"transformers-{mode}", "batch": batch, "error": repr(e)[:400]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
