#!/usr/bin/env python3
"""Our tokenizers against Hugging Face's own, on a GPU host (it has `tokenizers`,
`transformers` and Jinja2; nothing is downloaded).

Trains three byte-level BPE tokenizers with the `tokenizers` library itself — GPT-2 style,
Llama-3 style (Split regex + ByteLevel, ignore_merges, TemplateProcessing BOS, header
special tokens) and Qwen2 style (NFC, one digit per piece, ChatML specials) — on this
Python installation's standard library sources (a multi-megabyte corpus of code, prose
and some Unicode), writes them as model directories with chat templates, then compares,
line by line, `dist/bin/tokenize_check` (our C++ tokenizer) with `Tokenizer.encode`, and
our chat template rendering with transformers' `apply_chat_template`.

    python3 bench/tokenizer_check.py [--bin dist/bin/tokenize_check] [--out $OUT] [--vocab 32000]
Prints a table last; exits non-zero on any mismatch.
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import sysconfig
import tempfile

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "worker", "tokenizer"))
from patterns import GPT2, LLAMA3, QWEN2  # noqa: E402 (the regexes as tokenizer.json spells them)
LLAMA3_CHAT = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
QWEN2_CHAT = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TRICKY = ["Hello, world!  How's it going?\n\nI'm fine", "don't DON'T We'RE they've I'LL", "12345 6789012 3.14159",
          "naïve café — nai\u0308ve cafe\u0301", "日本語のテキスト、句読点。", "Привет, мир! 123", "مرحبا بالعالم ٣٤٥",
          "emoji 😀👍🏽 and ♥♥", "tabs\tand\nnewlines\r\n\r\nend\n", "   leading", "trailing   ", "\u00a0nbsp\u3000ideo",
          "<|begin_of_text|>x<|eot_id|>", "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "x²+y² Ⅻ ½", "'s 'S 'ſ"]


def corpus(limit_bytes):
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
    random.Random(0).shuffle(files)
    text, n = [], 0
    for f in files:
        try:
            t = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        text.append(t)
        n += len(t)
        if n > limit_bytes:
            break
    return text


def build(kind, texts, vocab, root):
    if kind == "gpt2":
        specials = ["<|endoftext|>"]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        config = {"chat_template": QWEN2_CHAT, "eos_token": "<|endoftext|>"}
    else:
        specials = (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
                    if kind == "llama3" else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
        if kind == "qwen2":
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3 if kind == "llama3" else QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        config = ({"chat_template": LLAMA3_CHAT, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
                  if kind == "llama3" else {"chat_template": QWEN2_CHAT, "eos_token": "<|im_end|>"})
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    if kind == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                                  processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                                                special_tokens=[("<|begin_of_text|>", bos)])])
    d = os.path.join(root, kind)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    json.dump(config, open(os.path.join(d, "tokenizer_config.json"), "w"))
    return tok, d, config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="dist/bin/tokenize_check")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--lines", type=int, default=3000)
    a = ap.parse_args()
    texts = corpus(8 << 20)
    lines = [l for t in texts for l in t.splitlines(keepends=True) if l.strip()]
    rng = random.Random(1)
    cases = TRICKY + rng.sample(lines, min(a.lines, len(lines))) + ["".join(rng.sample(lines, 5)) for _ in range(200)]
    chats = [[{"role": "user", "content": c}] for c in cases[:50]] + [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  Hi!  "}, {"role": "assistant", "content": "Hello."},
         {"role": "user", "content": cases[i]}] for i in range(50, 100)]
    root = tempfile.mkdtemp(prefix="tok-check-")
    rows, failures = [], []
    from transformers import PreTrainedTokenizerFast
    for kind in ("gpt2", "llama3", "qwen2"):
        tok, d, config = build(kind, texts, a.vocab, root)
        hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"),
                                     bos_token=config.get("bos_token"), eos_token=config.get("eos_token"))
        hf.chat_template = config["chat_template"]
        inputs = [{"text": c, "add_special": s} for c in cases for s in (False, True)]
        inputs += [{"messages": m, "add_generation_prompt": g} for m in chats for g in (False, True)]
        p = subprocess.run([a.bin, d], input="\n".join(json.dumps(x) for x in inputs) + "\n", capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            sys.exit(1)
        ours = [json.loads(l) for l in p.stdout.splitlines()]
        ids_bad = chat_bad = dec_bad = 0
        for x, o in zip(inputs, ours):
            if "messages" in x:
                want_chat = hf.apply_chat_template(x["messages"], tokenize=False, add_generation_prompt=x["add_generation_prompt"])
                if o.get("chat") != want_chat:
                    chat_bad += 1
                    failures.append({"kind": kind, "case": x, "ours": o.get("chat", o.get("error")), "theirs": want_chat})
                    continue
                want = tok.encode(want_chat, add_special_tokens=False).ids
            else:
                want = tok.encode(x["text"], add_special_tokens=x["add_special"]).ids
            if o.get("ids") != want:
                ids_bad += 1
                failures.append({"kind": kind, "case": x, "ours": o.get("ids", o.get("error")), "theirs": want})
            elif o.get("decoded") != tok.decode(want, skip_special_tokens=False):
                dec_bad += 1
                failures.append({"kind": kind, "case": x, "decoded": o.get("decoded"), "theirs": tok.decode(want, skip_special_tokens=False)})
        rows.append((kind, tok.get_vocab_size(), len(inputs), ids_bad, dec_bad, chat_bad))
    os.makedirs(a.out, exist_ok=True)
    json.dump({"rows": rows, "failures": failures[:200]}, open(os.path.join(a.out, "tokenizer_check.json"), "w"), ensure_ascii=False, indent=1)
    for r in rows:  # one JSON line per tokenizer (bench/suites.py reads them)
        print(json.dumps({"tokenizer": r[0], "vocab": r[1], "cases": r[2], "ids_differ": r[3], "decode_differ": r[4],
                          "chat_differ": r[5]}))
    print(f"{'tokenizer':10} {'vocab':>7} {'cases':>6} {'ids!=':>6} {'decode!=':>9} {'chat!=':>7}")
    for r in rows:
        print(f"{r[0]:10} {r[1]:7d} {r[2]:6d} {r[3]:6d} {r[4]:9d} {r[5]:7d}")
    sys.exit(1 if any(r[3] or r[4] or r[5] for r in rows) else 0)


main()
