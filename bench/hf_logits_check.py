"""Our forward against transformers on the same Hugging Face weights (run on a GPU host,
where PyTorch and transformers are installed). For Llama (GQA, untied) and Qwen2 (QKV
bias, tied embeddings): a small random model is saved with save_pretrained
(safetensors, f32), bench/hf_logits (our import + CPU forward, f32) prints its logits
for 24 tokens, and transformers' logits for the same tokens are computed in f32 (on the
GPU with TF32 off, and on the CPU). Prints the largest absolute and relative differences
and a PASS/FAIL line per model (tolerance 1e-4 of the logits' scale: f32 against f32).
On a GPU also our CUDA engine in bf16 (mixed precision) against transformers in bf16 on
the same GPU: both against the f32 reference, ours must stay within twice transformers'
own bf16 error plus 1e-3 of the scale ("within bf16 tolerance").
The export / import round trip is a unit test (tests/worker/checkpoint/hf_test.cc)."""
import json
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
binary = sys.argv[1] if len(sys.argv) > 1 else "dist/bin/hf_logits"
ok = True
for name, cfg_cls, model_cls, extra in (
    ("llama", LlamaConfig, LlamaForCausalLM, dict(num_key_value_heads=2, tie_word_embeddings=False)),
    ("qwen2", Qwen2Config, Qwen2ForCausalLM, dict(num_key_value_heads=2, tie_word_embeddings=True)),
):
    torch.manual_seed(0)
    cfg = cfg_cls(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=128, **extra)
    model = model_cls(cfg).float().eval()
    with torch.no_grad():  # larger weights than the default init, so that every layer matters
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        out = subprocess.run([binary, d, "24", "7"], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{name}: hf_logits failed: {out.stderr.strip()}")
            ok = False
            continue
        ours = json.loads(out.stdout)
        gpu = None
        if torch.cuda.is_available():
            out = subprocess.run([binary, d, "24", "7", "cuda-bf16"], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{name}: hf_logits cuda-bf16 failed: {out.stderr.strip()}")
                ok = False
            else:
                gpu = torch.tensor(json.loads(out.stdout)["logits"], dtype=torch.float64)
    tokens = torch.tensor([ours["tokens"]])
    mine = torch.tensor(ours["logits"], dtype=torch.float64)
    for dev in (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]:
        with torch.no_grad():
            ref = model.to(dev)(tokens.to(dev)).logits[0].double().cpu()
        scale = ref.abs().max().item()
        diff = (mine - ref).abs().max().item()
        passed = diff <= 1e-4 * scale
        ok &= passed
        print(f"{name} ({dev}): max |ours - transformers| = {diff:.3e}, logits scale {scale:.3f}, "
              f"relative {diff / scale:.2e} -> {'PASS' if passed else 'FAIL'}")
    if gpu is not None:
        with torch.no_grad():
            ref = model.to("cuda")(tokens.to("cuda")).logits[0].double().cpu()
            tf_bf16 = model.to(torch.bfloat16)(tokens.to("cuda")).logits[0].double().cpu()
            model.float()
        scale = ref.abs().max().item()
        e_ours, e_tf = (gpu - ref).abs().max().item(), (tf_bf16 - ref).abs().max().item()
        mean_ours, mean_tf = (gpu - ref).abs().mean().item(), (tf_bf16 - ref).abs().mean().item()
        passed = e_ours <= 2 * e_tf + 1e-3 * scale
        ok &= passed
        print(f"{name} (cuda, bf16): max |ours - f32 ref| = {e_ours:.3e} (mean {mean_ours:.3e}), transformers bf16 "
              f"{e_tf:.3e} (mean {mean_tf:.3e}), max |ours - transformers bf16| = {(gpu - tf_bf16).abs().max().item():.3e}, "
              f"scale {scale:.3f} -> {'PASS' if passed else 'FAIL'}")
print("hf logits check:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
