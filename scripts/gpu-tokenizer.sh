#!/usr/bin/env bash
# On a GPU host (it has Hugging Face's tokenizers / transformers; the GPU itself is
# not used): our tokenizer and chat templates against theirs on three freshly trained
# 32k-token byte-level BPE vocabularies (bench/tokenizer_check.py). Table last; the
# failures, if any, in $OUT/tokenizer_check.json.
#   bash scripts/gpu-tokenizer.sh on a host with 1 GPU (after scripts/make-dist.sh)
set -euo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 bench/tokenizer_check.py --bin dist/bin/tokenize_check --out "$OUT"
