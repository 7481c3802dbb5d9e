"""The pre-tokenizer regexes of the GPT-2, Llama-3 and Qwen2 tokenizers, as their
tokenizer.json files spell them, and a compiler for Python's `regex` engine with \\s
meaning the Unicode White_Space class (as Hugging Face's Rust/Oniguruma engines do;
Python's \\s also takes \\x1c-\\x1f). Shared by gen_cases.py, gen_fixtures.py and
bench/tokenizer_check.py."""
WS = r"\t\n\x0b\x0c\r\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def compile_ws(p):
    import regex
    p = p.replace(r"[^\s", "[^" + WS).replace(r"(?!\S)", "(?![^" + WS + "])").replace(r"\s", "[" + WS + "]")
    return regex.compile(p)
