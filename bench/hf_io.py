#!/usr/bin/env python3
"""Checkpoint load and save speed against the disk and against transformers (a GPU host
with torch and transformers; nothing is downloaded). For each model — Qwen3-1.7B (one
file) and Qwen2.5-7B (save_pretrained's shards and index) at their exact configs, random
weights saved by save_pretrained in bf16 — on one GPU:

- disk: the weight files evicted from the page cache, read sequentially (dist/bin/hf_io_bench);
- ours: checkpoint::ImportHf into the engine's bf16 model on the GPU (f32 master weights
  and bf16 compute copies), files evicted first (cold) and again warm; ExportHf in bf16
  (fsynced), sharded above 5 GiB with an index;
- transformers: AutoModelForCausalLM.from_pretrained(dtype=bfloat16, device_map="cuda"),
  cold (files evicted) and warm; save_pretrained of that model.
GB/s are of the weight files' bytes (10^9 per second).

    python3 bench/hf_io.py [--bin dist/bin/hf_io_bench] [--models qwen3_1p7b,qwen25_7b]
Prints one JSON line per model and a table last.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_fidelity import MODELS as CONFIGS  # the exact configs (model_type, kwargs[, TP])

MODELS = {name: CONFIGS[name][:2] for name in ("qwen3_1p7b", "qwen25_7b")}


def weight_files(d):
    return sorted(glob.glob(os.path.join(d, "*.safetensors")))


def evict(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="dist/bin/hf_io_bench")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        model_type, kw = MODELS[name]
        t0 = time.time()
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
            d = os.path.join(tmp, name)
            cfg = AutoConfig.for_model(model_type, **kw)
            with torch.device("cuda"):
                hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
            hf.save_pretrained(d)
            del hf
            torch.cuda.empty_cache()
            files = weight_files(d)
            nbytes = sum(os.path.getsize(f) for f in files)
            r = subprocess.run([args.bin, d, os.path.join(tmp, "ours-export"), "cuda", "bf16"], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{args.bin} failed on {name}: {r.stderr}")
            ours = json.loads(r.stdout.strip().splitlines()[-1])
            shutil.rmtree(os.path.join(tmp, "ours-export"))  # the disk holds one model's copies at a time
            torch.cuda.synchronize()
            evict(files)
            t = time.perf_counter()
            m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, device_map="cuda")
            torch.cuda.synchronize()
            hf_cold = time.perf_counter() - t
            del m
            torch.cuda.empty_cache()
            t = time.perf_counter()
            m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, device_map="cuda")
            torch.cuda.synchronize()
            hf_warm = time.perf_counter() - t
            out = os.path.join(tmp, "hf-export")
            t = time.perf_counter()
            m.save_pretrained(out)
            for f in weight_files(out):  # fsynced, as ours is
                fd = os.open(f, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            hf_save = time.perf_counter() - t
            hf_save_bytes = sum(os.path.getsize(f) for f in weight_files(out))
            del m
            torch.cuda.empty_cache()
            rec = dict(model=name, files=len(files), gb=nbytes / 1e9, disk_gbps=ours["disk_read_gbps"],
                       ours_cold_gbps=ours["import_cold_gbps"], ours_warm_gbps=ours["import_warm_gbps"],
                       ours_cold_resident=ours["resident_before_cold_import"],
                       hf_cold_gbps=nbytes / hf_cold / 1e9, hf_warm_gbps=nbytes / hf_warm / 1e9,
                       ours_save_gbps=ours["export_gbps"], ours_save_files=ours["export_files"],
                       hf_save_gbps=hf_save_bytes / hf_save / 1e9, hf_save_files=len(weight_files(out)),
                       ours=ours, hf_load_cold_s=hf_cold, hf_load_warm_s=hf_warm, hf_save_s=hf_save)
            print(json.dumps(rec), flush=True)
            rows.append(rec)
        print(f"# {name}: {time.time() - t0:.0f} s", flush=True)
    print("\n| model | GB (files) | disk read GB/s | load cold: ours / transformers GB/s | load warm: ours / transformers | save: ours / transformers GB/s (files) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['gb']:.2f} ({r['files']}) | {r['disk_gbps']:.2f} | {r['ours_cold_gbps']:.2f} / {r['hf_cold_gbps']:.2f} "
              f"| {r['ours_warm_gbps']:.2f} / {r['hf_warm_gbps']:.2f} | {r['ours_save_gbps']:.2f} ({r['ours_save_files']}) / "
              f"{r['hf_save_gbps']:.2f} ({r['hf_save_files']}) |")


if __name__ == "__main__":
    main()
