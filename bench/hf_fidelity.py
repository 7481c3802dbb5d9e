#!/usr/bin/env python3
"""The engine against transformers at the shapes RL users train (a GPU host with torch and
transformers; nothing is downloaded). For each model — Llama-3.2-1B (llama3 RoPE scaling,
tied) and Qwen3-1.7B (q/k norm, head_dim 128, tied), their exact configs with random
weights (transformers' own initialization) saved by save_pretrained in bf16 — both sides
run the same directory on the same GPU:

- logits of one T-token sequence: ours in f32 (dist/bin/hf_model_run cuda f32) against
  transformers in f32 (TF32 off): max |difference| within 1e-4 of the logits' scale;
  ours in bf16 (mixed precision) against transformers in f32: within twice transformers'
  own bf16 error plus 1e-3 of the scale;
- one step's gradients of the mean next-token cross-entropy (f32, PyTorch autograd on the
  transformers model): the embedding, layer 0's q/k projections (and q_norm), layer 1's
  down projection, the final norm, each within 1e-3 of its scale;
- greedy decoding of N tokens after a prompt, f32: token for token (transformers:
  argmax of each step's last logits with its KV cache; ours: the rollout engine).
Qwen2.5-7B and Qwen2.5-1.5B (2 KV heads: replicated at TP 4) run ours at tensor
parallelism 4 (hf_model_run --tp=4: a process per GPU), transformers on one GPU.
A reward model (qwen3_1p7b_rm: Qwen3-1.7B's config as Qwen3ForSequenceClassification with
one label, as RL's reward groups load it): the score of each of a batch of sequences of
different lengths (ours: the value head at the last token), f32 within 1e-4 of the
scores' scale and bf16 within twice transformers' own bf16 error plus 1e-3.

    python3 bench/hf_fidelity.py [--bin dist/bin/hf_model_run] [--tokens 128] [--greedy 128] [--models llama32_1b,qwen3_1p7b,qwen25_7b,qwen25_1p5b]
Prints one JSON line per comparison and a table last; exits non-zero on a FAIL.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

MODELS = {
    # meta-llama/Llama-3.2-1B's config.json
    "llama32_1b": ("llama", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                 num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
                                 max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=128000,
                                 eos_token_id=128001,
                                 rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                                                      low_freq_factor=1.0, high_freq_factor=4.0,
                                                      original_max_position_embeddings=8192))),
    # Qwen/Qwen3-1.7B's config.json
    "qwen3_1p7b": ("qwen3", dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                                 max_position_embeddings=40960, tie_word_embeddings=True, bos_token_id=151643,
                                 eos_token_id=151645, use_sliding_window=False,
                                 rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # Qwen/Qwen2.5-7B's config.json (QKV bias, 28 heads over 4 KV heads, untied), ours at TP 4
    "qwen25_7b": ("qwen2", dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                num_attention_heads=28, num_key_value_heads=4, rms_norm_eps=1e-6,
                                max_position_embeddings=131072, tie_word_embeddings=False, bos_token_id=151643,
                                eos_token_id=151643, use_sliding_window=False,
                                rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), 4),
    # Qwen/Qwen2.5-1.5B's config.json (12 heads over 2 KV heads, tied), ours at TP 4: each KV
    # head on two ranks
    "qwen25_1p5b": ("qwen2", dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                  num_attention_heads=12, num_key_value_heads=2, rms_norm_eps=1e-6,
                                  max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=151643,
                                  eos_token_id=151643, use_sliding_window=False,
                                  rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), 4),
}
# Sequence classifiers (reward models): the base model's name.
REWARD_MODELS = {"qwen3_1p7b_rm": "qwen3_1p7b"}
GRADS = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
         "model.layers.0.self_attn.q_norm.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight")


def run_ours(binary, d, out, dtype, tokens_path, prompt_path, n, tp=1):
    os.makedirs(out, exist_ok=True)
    cmd = [binary] + ([f"--tp={tp}"] if tp > 1 else []) + [d, out, "cuda", dtype, tokens_path] + ([prompt_path, str(n)] if prompt_path else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def reward_model(a, name, report):
    """transformers' sequence-classification score of sequences of several lengths against
    ours (hf_model_run's values at each sequence's last token), f32 and bf16."""
    from transformers import AutoModelForSequenceClassification
    model_type, kw, *_ = MODELS[REWARD_MODELS[name]]
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, num_labels=1, architectures=["Qwen3ForSequenceClassification"], **kw)
        t0 = time.time()
        hf = AutoModelForSequenceClassification.from_config(cfg, dtype=torch.bfloat16)
        with torch.no_grad():  # a head of the scale a trained one has (the default init is ~0.02)
            hf.score.weight.normal_(0, 1.0 / kw["hidden_size"] ** 0.5)
        d = os.path.join(tmp, "model")
        hf.save_pretrained(d)
        del hf
        ref = AutoModelForSequenceClassification.from_pretrained(d, dtype=torch.float32).cuda().eval()
        g = torch.Generator().manual_seed(2)
        lengths = (a.tokens, a.tokens // 2 + 3, 17)
        seqs = [torch.randint(0, cfg.vocab_size, (1, n), generator=g) for n in lengths]
        with torch.no_grad():
            want = np.array([float(ref(s.cuda()).logits[0, 0]) for s in seqs])
            bf_model = ref.to(torch.bfloat16)
            bf = np.array([float(bf_model(s.cuda()).logits[0, 0]) for s in seqs])
        del ref, bf_model
        torch.cuda.empty_cache()
        got = {}
        for dtype in ("f32", "bf16"):
            scores = []
            for i, s in enumerate(seqs):
                path = os.path.join(tmp, f"seq{i}.i32")
                s.numpy().astype("<i4").tofile(path)
                out = os.path.join(tmp, f"{dtype}-{i}")
                run_ours(a.bin, d, out, dtype, path, None, 0)
                scores.append(float(np.fromfile(os.path.join(out, "values.f32"), dtype="<f4")[-1]))
            got[dtype] = np.array(scores)
        scale = max(float(np.abs(want).max()), 1e-6)
        e32 = float(np.abs(got["f32"] - want).max())
        report(name, "scores f32", e32 / scale, 1e-4, e32 <= 1e-4 * scale, scale=scale, lengths=list(lengths))
        e16, etf = float(np.abs(got["bf16"] - want).max()), float(np.abs(bf - want).max())
        report(name, "scores bf16 (vs f32 ref)", e16 / scale, (2 * etf + 1e-3 * scale) / scale, e16 <= 2 * etf + 1e-3 * scale,
               transformers_bf16=etf / scale)
        print(f"# {name}: {time.time() - t0:.0f} s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="dist/bin/hf_model_run")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--greedy", type=int, default=128)
    ap.add_argument("--models", default=",".join(list(MODELS) + list(REWARD_MODELS)))
    ap.add_argument("--tp", type=int, default=0, help="ours at this TP degree instead of each model's own")
    a = ap.parse_args()
    rows, ok = [], True

    def report(model, check, value, limit, passed, **extra):
        nonlocal ok
        ok &= passed
        rec = dict(model=model, check=check, value=value, limit=limit, result="PASS" if passed else "FAIL", **extra)
        print(json.dumps(rec), flush=True)
        rows.append(rec)

    for name in a.models.split(","):
        if name in REWARD_MODELS:
            reward_model(a, name, report)
            continue
        model_type, kw, *rest = MODELS[name]  # rest: ours' TP degree
        tp = a.tp or (rest[0] if rest else 1)
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            cfg = AutoConfig.for_model(model_type, **kw)
            t0 = time.time()
            hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
            d = os.path.join(tmp, "model")
            hf.save_pretrained(d)
            del hf
            ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).cuda().eval()
            g = torch.Generator().manual_seed(1)
            tokens = torch.randint(0, cfg.vocab_size, (1, a.tokens), generator=g)
            prompt = torch.randint(0, cfg.vocab_size, (1, 16), generator=g)
            tokens.numpy().astype("<i4").tofile(os.path.join(tmp, "tokens.i32"))
            prompt.numpy().astype("<i4").tofile(os.path.join(tmp, "prompt.i32"))
            # transformers, f32: logits, gradients, greedy decoding with its KV cache.
            ref.zero_grad()
            res = ref(tokens.cuda(), labels=tokens.cuda())
            res.loss.backward()
            want = res.logits[0].detach().double().cpu().numpy()
            params = dict(ref.named_parameters())
            want_grads = {n: params[n].grad.detach().double().cpu().numpy() for n in GRADS if n in params}
            with torch.no_grad():
                past, seq, greedy = None, prompt.cuda(), []
                out = ref(seq, use_cache=True)
                for _ in range(a.greedy):
                    nxt = out.logits[0, -1].argmax().view(1, 1)
                    greedy.append(int(nxt))
                    out = ref(nxt, past_key_values=out.past_key_values, use_cache=True)
                bf = ref.to(torch.bfloat16)(tokens.cuda()).logits[0].double().cpu().numpy()
            del ref, res
            torch.cuda.empty_cache()
            scale = float(np.abs(want).max())
            # Ours, f32 then bf16.
            o32 = os.path.join(tmp, "f32")
            info = run_ours(a.bin, d, o32, "f32", os.path.join(tmp, "tokens.i32"), os.path.join(tmp, "prompt.i32"), a.greedy, tp)
            ours = np.fromfile(os.path.join(o32, "logits.f32"), dtype="<f4").reshape(want.shape)
            diff = float(np.abs(ours - want).max())
            report(name, "logits f32", diff / scale, 1e-4, diff <= 1e-4 * scale, scale=scale, load_s=info["load_s"], tp=tp)
            for n, w in want_grads.items():
                path = os.path.join(o32, f"grad.{n}.f32")
                got = np.fromfile(path, dtype="<f4").reshape(w.shape)
                gs = float(np.abs(w).max())
                e = float(np.abs(got - w).max())
                report(name, f"grad {n}", e / gs if gs > 0 else e, 1e-3, e <= 1e-3 * gs)
            got_greedy = np.fromfile(os.path.join(o32, "greedy.i32"), dtype="<i4").tolist()
            same = sum(1 for x, y in zip(got_greedy, greedy) if x == y)
            first = next((i for i, (x, y) in enumerate(zip(got_greedy, greedy)) if x != y), None)
            report(name, f"greedy {a.greedy} tokens f32", same, a.greedy, got_greedy == greedy, first_difference=first)
            o16 = os.path.join(tmp, "bf16")
            run_ours(a.bin, d, o16, "bf16", os.path.join(tmp, "tokens.i32"), None, 0, tp)
            ours16 = np.fromfile(os.path.join(o16, "logits.f32"), dtype="<f4").reshape(want.shape)
            e_ours, e_tf = float(np.abs(ours16 - want).max()), float(np.abs(bf - want).max())
            report(name, "logits bf16 (vs f32 ref)", e_ours / scale, (2 * e_tf + 1e-3 * scale) / scale,
                   e_ours <= 2 * e_tf + 1e-3 * scale, transformers_bf16=e_tf / scale,
                   mean_ours=float(np.abs(ours16 - want).mean()) / scale, mean_transformers=float(np.abs(bf - want).mean()) / scale)
            print(f"# {name}: {time.time() - t0:.0f} s", flush=True)
    print("\n| model | check | ours | limit | result |\n|---|---|---|---|---|")
    for r in rows:
        v = r["value"]
        print(f"| {r['model']} | {r['check']} | {v:.3g} | {r['limit']:.3g} | {r['result']} |")
    print("hf fidelity:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
