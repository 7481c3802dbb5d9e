#!/usr/bin/env python3
"""Regenerates the Hugging Face model fixtures in tests/worker/checkpoint/hf_models/: one
directory per case, as save_pretrained writes it (config.json, generation_config.json,
model.safetensors), plus reference.safetensors with what transformers computes on it.
Needs PyTorch and transformers (a GPU host has both; nothing is downloaded):

    python3 tests/worker/checkpoint/hf_models/gen_fixtures.py [OUT_DIR]

Each case is a small random model of one architecture the engine supports, with weights
larger than the default initialization so that every layer matters, saved in the dtype
its family publishes in. The references come from the saved weights, read back and run in
float64 on the CPU (so that they hold transformers' arithmetic, not its f32 rounding):
- tokens [T] and logits [T, vocab] of one sequence of T tokens at positions 0..T-1;
- inv_freq [head_dim / 2] and attention_scaling [1]: the rotary embedding's frequencies
  and its cos/sin factor after that forward (dynamic scaling updates them per sequence);
- grad.<name>: the gradients of the mean next-token cross-entropy over the sequence for a
  few parameters (the embedding, layer 0's attention, layer 1's MLP, the final norm);
- prompt [P] and greedy [N]: N tokens of greedy decoding after the prompt (each step the
  argmax of the last position's logits over the whole sequence so far);
and versions.txt records the transformers and torch versions that made them.
"""
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
MAJOR = int(transformers.__version__.split(".")[0])

SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, rms_norm_eps=1e-6)


def rope(theta, scaling):
    """The rotary settings in this transformers version's spelling."""
    if MAJOR >= 5:
        p = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            p.update(scaling)
        return {"rope_parameters": p}
    out = {"rope_theta": theta}
    if scaling:
        s = dict(scaling)
        out["rope_scaling"] = s
    return out


# name: (model_type, extra config, dtype saved, sequence length, gradients, greedy)
CASES = {
    # Llama 3.2 style: llama3 frequency scaling, tied embeddings, bf16 weights.
    "llama32_rope_llama3": ("llama", dict(tie_word_embeddings=True, max_position_embeddings=2048, **rope(
        500000.0, dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=64))), torch.bfloat16, 100, True, True),
    "llama_rope_linear": ("llama", dict(tie_word_embeddings=False, max_position_embeddings=256, **rope(
        10000.0, dict(rope_type="linear", factor=4.0))), torch.float32, 100, False, True),
    # Dynamic NTK: the sequence (100) outruns max_position_embeddings (64).
    "llama_rope_dynamic": ("llama", dict(tie_word_embeddings=False, max_position_embeddings=64, **rope(
        10000.0, dict(rope_type="dynamic", factor=2.0))), torch.float32, 100, False, False),
    # Qwen2.5 long-context style: QKV bias, YaRN, tied embeddings.
    "qwen2_rope_yarn": ("qwen2", dict(tie_word_embeddings=True, max_position_embeddings=256, use_sliding_window=False,
                                       **rope(10000.0, dict(rope_type="yarn", factor=4.0,
                                                             original_max_position_embeddings=32))),
                        torch.float32, 100, False, True),
    # Qwen3: per-head q/k RMSNorm, head_dim independent of hidden / heads, tied, bf16.
    "qwen3": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                            max_position_embeddings=512, use_sliding_window=False, **rope(1000000.0, None)),
              torch.bfloat16, 64, True, True),
}
GRADS = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
         "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
         "model.layers.1.mlp.down_proj.weight", "model.norm.weight")


def make(name, model_type, extra, dtype, seq, grads, greedy, out):
    torch.manual_seed(sum(map(ord, name)))
    kw = dict(SMALL)
    kw.update(extra)
    cfg = AutoConfig.for_model(model_type, **kw)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    model.to(dtype).save_pretrained(d, safe_serialization=True)
    ref = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64).eval()
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, cfg.vocab_size, (1, seq), generator=g)
    ref.zero_grad()
    res = ref(tokens, labels=tokens)
    res.loss.backward()
    rot = ref.model.rotary_emb
    r = {"tokens": tokens[0].float(), "logits": res.logits[0].detach().float(),
         "inv_freq": rot.inv_freq.detach().float().reshape(-1),
         "attention_scaling": torch.tensor([float(rot.attention_scaling)])}
    if grads:
        params = dict(ref.named_parameters())
        for n in GRADS:
            if n in params:
                r["grad." + n] = params[n].grad.detach().float().contiguous()
    if greedy:
        prompt = torch.randint(0, cfg.vocab_size, (1, 8), generator=g)
        seqs = prompt
        with torch.no_grad():
            for _ in range(24):
                nxt = ref(seqs).logits[0, -1].argmax()
                seqs = torch.cat([seqs, nxt.view(1, 1)], dim=1)
        r["prompt"] = prompt[0].float()
        r["greedy"] = seqs[0, 8:].float()
    save_file({k: v.contiguous() for k, v in r.items()}, os.path.join(d, "reference.safetensors"))
    print(f"{name}: loss {res.loss.item():.6f}, logits scale {res.logits.abs().max().item():.3f}, "
          f"attention_scaling {float(rot.attention_scaling):.6f}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else HERE
    os.makedirs(out, exist_ok=True)
    for name, (model_type, extra, dtype, seq, grads, greedy) in CASES.items():
        make(name, model_type, extra, dtype, seq, grads, greedy, out)
    with open(os.path.join(out, "versions.txt"), "w") as f:
        f.write(f"transformers {transformers.__version__}\ntorch {torch.__version__}\n")


if __name__ == "__main__":
    main()
