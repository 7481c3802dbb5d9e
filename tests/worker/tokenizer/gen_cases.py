#!/usr/bin/env python3
"""Regenerates tests/worker/tokenizer/cases.json: pre-tokenizer splits by the Python
`regex` engine (the patterns' own semantics) and NFC by `unicodedata`, for the C++
scanners and normalizer to be checked against. \\s is replaced by the Unicode White_Space
class, which is what the Rust/Oniguruma engines of Hugging Face tokenizers mean by it
(Python's \\s also takes \\x1c-\\x1f). Deterministic (fixed seed); the file is checked in:
    python3 tests/worker/tokenizer/gen_cases.py > tests/worker/tokenizer/cases.json
"""
import json
import random
import unicodedata

import regex

from patterns import GPT2, LLAMA3, QWEN2, compile_ws  # noqa: E402 (this directory)


PATTERNS = {"gpt2": compile_ws(GPT2), "llama3": compile_ws(LLAMA3), "qwen2": compile_ws(QWEN2)}

FIXED = [
    "Hello world", "Hello, world!  How's it going?\n\nI'm fine", "don't DON'T We'RE they've I'LL he'D",
    "'s 'S 'ſ 'x ''s", "12345 6789012 3.14159 1,000,000", "x = a+b*(c-d)/e; // comment",
    "  leading and trailing  ", "tabs\tand\nnewlines\r\n\r\nend\n", "a\n\n\nb", "   \n  x",
    "(hello) [world] {foo}", "naïve café résumé", "nai\u0308ve cafe\u0301", "日本語のテキスト、句読点。",
    "Привет, мир! 123", "مرحبا بالعالم ٣٤٥", "emoji 😀👍🏽 and ♥♥", "superscript x² and roman Ⅻ ½",
    "nbsp\u00a0here and\u3000ideographic", "trailing spaces   ", "\n", " ", "", "a", "!!!???...",
    "  !!  ?? ", "$100 and €20", "line1\nline2\r\nline3\rline4", "mixed123abc456def",
    "x\u0301\u0301y", "don't\n\n\n   stop", "\t\tindented\n\t\tcode", "A.B.C. U.S.A.",
    "'ll'll've", "he said 'hi'", "1st 2nd 3rd 100th", "e.g. i.e. etc.",
]
PALETTE = (list("abcXYZ019 '\n\r\t.,!?-_()\"") + ["s", "t", "re", "ll", "ve", "d", "m", "S", "T", "ſ"]
           + ["é", "e\u0301", "日", "本", "ß", "٣", "²", "Ⅻ", "\u00a0", "\u3000", "\u2028", "😀", "€", "…", "\u200b"])


def random_texts(n, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(PALETTE) for _ in range(rng.randint(1, 24))) for _ in range(n)]


NFC_TEXTS = [
    "e\u0301", "cafe\u0301", "A\u030a", "\u212b", "o\u0308\u0304", "a\u0328\u0301", "a\u0301\u0328",
    "\u1100\u1161", "\u1100\u1161\u11a8", "\uac00\u11a8", "\u0958", "\u1e0b\u0323", "q\u0307\u0323",
    "\u0b47\u0b3e", "\u00c5\u0301", "Ä\u0300ä", "plain ascii", "日本\u3099", "\u304b\u3099",
    "\ufb01 ligature stays", "\u2126 ohm", "x\u0315\u0300\u05ae\u0300b", "\u0041\u0308\u0304\u0323",
    "a\u0316\u0323", "e\u0316\u0301\u0323",
]


def main():
    cases = []
    texts = FIXED + random_texts(400, 7)
    for name, pat in PATTERNS.items():
        for t in texts:
            cases.append({"pattern": name, "text": t, "pieces": pat.findall(t)})
    nfc = [{"text": t, "nfc": unicodedata.normalize("NFC", t)} for t in NFC_TEXTS]
    rng = random.Random(11)
    marks = ["\u0316", "\u0300", "\u0301", "\u0308", "\u0323", "\u0328", "\u0304", "\u0315", "\u05ae", "\u3099", "\u11a8"]
    bases = ["a", "e", "o", "A", "u", "\u1100", "\u1161", "\uac00", "\u304b", "s", "\u0391"]
    for _ in range(200):
        t = "".join(rng.choice(bases + marks) for _ in range(rng.randint(1, 8)))
        nfc.append({"text": t, "nfc": unicodedata.normalize("NFC", t)})
    print(json.dumps({"split": cases, "nfc": nfc}, ensure_ascii=True, indent=0))


main()
