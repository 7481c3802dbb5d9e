#!/usr/bin/env python3
"""A Hugging Face model directory of Qwen/Qwen3-1.7B's architecture and shape with random
weights (transformers' own initialization, seeded; q/k norms, tied embeddings), saved in
bf16 by save_pretrained with the tokenizer files of --tokenizer beside it: what the RL
benchmarks load on both sides (Tessera's job as model.hf_dir, the peer with --hf-dir), so
that both start from the same weights.

  python3 bench/random_hf_model.py --out DIR [--tokenizer third_party/tokenizers/qwen3]
"""
import argparse
import os
import shutil

import torch
import transformers

# Qwen/Qwen3-1.7B's config.json.
QWEN3_1P7B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                  max_position_embeddings=40960, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
                  use_sliding_window=False, rope_parameters=dict(rope_type="default", rope_theta=1000000.0))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", default="third_party/tokenizers/qwen3")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    cfg = transformers.AutoConfig.for_model("qwen3", architectures=["Qwen3ForCausalLM"], **QWEN3_1P7B)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    m.save_pretrained(a.out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, f), os.path.join(a.out, f))
    print(f"{a.out}: Qwen3-1.7B shape, random, {sum(t.numel() for t in m.parameters()) / 1e9:.2f}B parameters")


if __name__ == "__main__":
    main()
