#!/usr/bin/env python3
"""A reward model's directory for Tessera's reward group, and the peer of its scoring:
transformers' Qwen3ForSequenceClassification (one label) at the Qwen3-1.7B shape.

  python3 bench/reward_model_peer.py --save DIR [--samples 256] [--tokens 1032] [--batch 32]

--save: the model's random weights (transformers' own initialization, the score head at
the scale of a trained one, seeded) in bf16 by save_pretrained, which the job then loads
as rl.reward_model. Then the peer: the same directory in bf16 on the GPU (SDPA
attention: PyTorch picks its flash backend for these unpadded causal batches), eager, no
grad, scoring --samples random sequences of --tokens tokens, --batch at a time (one
warm-up batch first). Prints one JSON line: seconds, tokens per second, the mean score
and torch.cuda.max_memory_allocated.
"""
import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

# Qwen/Qwen3-1.7B's config.json, as a sequence classifier of one label.
QWEN3_1P7B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                  max_position_embeddings=40960, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
                  use_sliding_window=False, rope_parameters=dict(rope_type="default", rope_theta=1000000.0))


def now():
    torch.cuda.synchronize()
    return time.perf_counter()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--save", required=True)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--tokens", type=int, default=1032)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    torch.manual_seed(0)
    # The pad token (Qwen's <|endoftext|>) lets transformers score batches: it reads each
    # row at its last token that is not one; the random ids below never are.
    cfg = AutoConfig.for_model("qwen3", num_labels=1, architectures=["Qwen3ForSequenceClassification"], pad_token_id=151643,
                               **QWEN3_1P7B)
    m = AutoModelForSequenceClassification.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        m.score.weight.normal_(0, 1.0 / cfg.hidden_size ** 0.5)
    m.save_pretrained(a.save)
    del m
    model = AutoModelForSequenceClassification.from_pretrained(a.save, dtype=torch.bfloat16,
                                                               attn_implementation="sdpa").cuda().eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.pad_token_id, (a.samples, a.tokens), generator=g).cuda()
    with torch.no_grad():
        model(input_ids=ids[:a.batch])  # warm-up
        torch.cuda.reset_peak_memory_stats()
        t0 = now()
        scores = torch.cat([model(input_ids=ids[i:i + a.batch]).logits[:, 0].float() for i in range(0, a.samples, a.batch)])
        seconds = now() - t0
    print(json.dumps({"engine": "transformers eager, SDPA", "samples": a.samples, "tokens": a.tokens, "batch": a.batch,
                      "seconds": seconds, "tokens_per_s": a.samples * a.tokens / seconds,
                      "mean_score": float(scores.mean()),
                      "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30}), flush=True)


if __name__ == "__main__":
    main()
