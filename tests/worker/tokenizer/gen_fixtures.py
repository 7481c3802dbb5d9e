#!/usr/bin/env python3
"""Regenerates the tokenizer fixtures in tests/worker/tokenizer/data/:

- {gpt2,llama3,qwen2}/tokenizer.json: small byte-level BPE tokenizers of each kind (the
  merges trained here on a small corpus, the layout of the real files: added tokens,
  Llama-3's ignore_merges and TemplateProcessing BOS, Qwen2's NFC normalizer), with
  tokenizer_config.json holding each family's chat template;
- bpe_cases.json: the ids a plain Python reference (the `regex` engine's splits and
  GPT-2's original merge loop, a different algorithm from the C++ one) gives for a set of
  texts, and chat_cases.json: the chat templates rendered by Jinja2 the way transformers'
  apply_chat_template does (trim_blocks, lstrip_blocks, loop controls, raise_exception,
  tojson).
Deterministic; the files are checked in:  python3 tests/worker/tokenizer/gen_fixtures.py
"""
import collections
import json
import os
import random
import unicodedata

import jinja2
import jinja2.ext
import jinja2.sandbox
import regex

HERE = os.path.dirname(os.path.abspath(__file__))
from patterns import GPT2, LLAMA3, QWEN2, compile_ws  # noqa: E402 (this directory)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
CORPUS = """The quick brown fox jumps over the lazy dog. It's a truth universally acknowledged that
a single model in possession of a good tokenizer must be in want of data. We'll see: don't
they've I'm he'd 12345 + 678 = 7023; 3.14159 and 2.71828. def main(): return x + y  # comment
Hello, world! How are you today? I'm fine, thanks. The answer is 42. Привет мир, как дела?
日本語のテキストです。中文文本也在这里。naïve café résumé über straße. The the the and and of of.
Tokenizers split text into pieces; BPE merges the most frequent pairs, again and again.
<html><body>Some markup &amp; entities</body></html> {"key": "value", "n": [1, 2, 3]}
zzz zzzz hmmm hmmmm aaah aaaah oooo eeee sss
""" * 3


def train(pattern, merges_wanted):
    words = collections.Counter()
    for piece in pattern.findall(unicodedata.normalize("NFC", CORPUS)):
        words[tuple(B2U[b] for b in piece.encode("utf-8"))] += 1
    vocab = {B2U[b]: i for i, b in enumerate(sorted(B2U))}
    merges = []
    while len(merges) < merges_wanted:
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        new = collections.Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += n
        words = new
    return vocab, merges


def added(id_, content, special=True, lstrip=False, rstrip=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": False, "special": special}


LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Qwen2.5's shape: whitespace control, tools as JSON, tool calls, `is defined`, `not`,
# attribute access, loop.last, namespace-free.
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('unknown role ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# More of Jinja: block tags on their own lines (trim_blocks / lstrip_blocks), filters,
# string methods, comparisons, arithmetic, `in`, ternaries, loop.length, break/continue.
MISC_TEMPLATE = """{# a comment #}
{% for m in messages %}
  {% if m.role not in ['user', 'assistant', 'system'] %}{{ raise_exception('bad role: ' ~ m.role) }}{% endif %}
  {% if m.content.startswith('skip') %}{% continue %}{% endif %}
  [{{ loop.index }}/{{ loop.length }}] {{ m.role | upper }}: {{ m.content.strip() | length }} chars, "{{ m.content | trim }}"
  {{ 'last' if loop.last else 'more' }} {{ (loop.index * 2 + 1) % 5 }} {{ m.content | lower | replace('a', '4') }}
  {% if m.content.endswith('stop') %}{% break %}{% endif %}
{% endfor %}
{% set n = messages | length %}{{ n > 2 and 'many' or 'few' }} {{ messages[-1]['role'] }} {{ 'x' in 'xyz' }} {{ none is none }}
{{ messages | map(attribute='role') | join(',') }} {{ messages[0].content[:3] }} {{ eos_token }}
"""

# Llama-3.1-like namespace use, tojson with indent, dict/list literals, Python number
# and repr formatting, slices, for-else, items(), selectattr, string methods.
EXTRA_TEMPLATE = """{%- set ns = namespace(system=none, users=0) %}
{%- for m in messages %}
    {%- if m.role == 'system' %}{% set ns.system = m.content %}{% endif %}
    {%- if m['role'] == 'user' %}{% set ns.users = ns.users + 1 %}{% endif %}
{%- endfor %}
system={{ ns.system }} users={{ ns.users }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }}
{{ {'a': 1, 'b': [1, 2.5, none, true, "it's"]} }} {{ {'k': 'v', 'n': [1, {'x': 0.1}]} | tojson(indent=2) }}
{{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 1e100 }} {{ 123456789.0 * 1000000000 }} {{ 2 ** 3 if false else 7 % -3 }} {{ 'ab' * 3 }}
{{ [1, 2, 3, 4, 5][::-2] }} {{ 'hello'[1:-1] }} {{ messages[-1].content[-3:] }} {{ 'a,b,,c'.split(',') }} {{ '  x  y '.split() }}
{%- for k, v in {'x': 1, 'y': 2}.items() %} {{ k }}={{ v }}{% endfor %}
{% for x in [] %}never{% else %}empty loop{% endfor %} {{ undefined_name is not defined }} {{ ns.missing | default('dflt') }}
{{ messages[0].get('role') }} {{ messages[0].get('nope', 'fallback') }} {{ 'Title case words' | title }} {{ 'MiXeD' | capitalize }}
{{ messages | map(attribute='role') | first }} {{ (messages | last).role }} {{ 3 is odd }} {{ 'x' is string }} {{ [1] is sequence }}
{%- for m in messages if m.role != 'system' %} {{ loop.index }}:{{ m.role }}{% endfor %}"""
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "  Hello there!  "},
     {"role": "assistant", "content": "Hi. How can I help?"}, {"role": "user", "content": "Tell me a joke."}],
    [{"role": "user", "content": "naïve café — 日本語 😀"}, {"role": "assistant", "content": "Sure: \"quoted\"\nand\ttabs"}],
    [{"role": "user", "content": "skip this one"}, {"role": "assistant", "content": "A banana and an apple"},
     {"role": "user", "content": "please stop"}, {"role": "assistant", "content": "never printed"}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "{\"sky\": \"clear\"}"},
    {"role": "assistant", "content": "21 degrees and clear."},
]


def render(template, **kw):
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(**kw)


def make(kind, pattern_text, merges_wanted, specials, template, extra):
    pat = compile_ws(pattern_text)
    vocab, merges = train(pat, merges_wanted)
    added_tokens = [added(len(vocab) + i, s) for i, s in enumerate(specials)]
    if kind == "gpt2":
        added_tokens.append(added(len(vocab) + len(specials), "<mask>", lstrip=True))
        added_tokens.append(added(len(vocab) + len(specials) + 1, "[[tool]]", special=False, rstrip=True))
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
           "normalizer": None, "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}}
    if kind == "gpt2":
        tok["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    else:
        tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern_text}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    if kind == "llama3":
        # A whole word in the vocabulary that the merges never build: ignore_merges
        # takes it as one token.
        vocab["\u0120qqqq"] = len(vocab)
        for a in added_tokens:
            a["id"] += 1
        tok["model"]["ignore_merges"] = True
        tok["model"]["merges"] = [[a, b] for a, b in merges]  # the newer list form
        bos = specials[0]
        tok["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [], "special_tokens": {bos: {"id": bos, "ids": [added_tokens[0]["id"]], "tokens": [bos]}}}]}
    if kind == "qwen2":
        tok["normalizer"] = {"type": "NFC"}
    d = os.path.join(HERE, "data", kind)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    config = {"chat_template": template, **extra}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
    return tok, pat


def reference_encode(tok, pat, text, add_special):
    ranks = {}
    for r, m in enumerate(tok["model"]["merges"]):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        ranks[(a, b)] = r
    vocab = tok["model"]["vocab"]
    specials = sorted(tok["added_tokens"], key=lambda a: -len(a["content"]))
    out = []
    if add_special and tok["post_processor"]["type"] == "Sequence":
        out += list(tok["post_processor"]["processors"][1]["special_tokens"].values())[0]["ids"]

    def bpe(piece):
        mapped = "".join(B2U[b] for b in piece.encode("utf-8"))
        if tok["model"]["ignore_merges"] and mapped in vocab:
            return [vocab[mapped]]
        word = list(mapped)
        while len(word) > 1:
            pairs = [(ranks.get((a, b), 1 << 60), a, b) for a, b in zip(word, word[1:])]
            r, a, b = min(pairs)
            if r == 1 << 60:
                break
            new, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    new.append(a + b)
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            word = new
        return [vocab[w] for w in word]

    def plain(segment):
        if not segment:
            return []
        if tok["normalizer"]:
            segment = unicodedata.normalize("NFC", segment)
        return [i for piece in pat.findall(segment) for i in bpe(piece)]

    start = i = 0
    while i < len(text):
        hit = next((a for a in specials if text.startswith(a["content"], i)), None)
        if not hit:
            i += 1
            continue
        before = text[start:i]
        if hit["lstrip"]:
            before = before.rstrip()
        out += plain(before) + [hit["id"]]
        i += len(hit["content"])
        if hit["rstrip"]:
            while i < len(text) and text[i].isspace():
                i += 1
        start = i
    return out + plain(text[start:])


TEXTS = [
    "The quick brown fox jumps over the lazy dog.", "It's a truth: don't, we'll, I'M", "12345 + 678 = 7023",
    "Hello, world!  How are you?\n\nFine.", "naïve café — nai\u0308ve cafe\u0301", "日本語のテキストです。",
    "def main():\n    return x + y  # comment\n", "<|endoftext|>Hello<|im_start|>user\nHi<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>", "emoji 😀👍🏽 ♥",
    "text <mask> more   <mask>x", "[[tool]]   args and [[tool]]", "", " ", "   leading", "trailing   ",
    "zzzzzzzzzzzzzzzzzzzz qqqq xxxxxx", "zzzzz hmmmmm aaaaaaah ooooo", "a qqqq qqqqq", "Привет мир, как дела?", "über straße STRASSE",
]


def main():
    rng = random.Random(5)
    alphabet = list(CORPUS) + ["😀", "\u0301", "\n", "  "]
    texts = TEXTS + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(150)]
    cases = []
    for kind, pattern, n, specials, template, extra in [
        ("gpt2", GPT2, 300, ["<|endoftext|>"], QWEN2_TEMPLATE, {"eos_token": "<|endoftext|>"}),
        ("llama3", LLAMA3, 400, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
         LLAMA3_TEMPLATE, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
        ("qwen2", QWEN2, 400, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], QWEN25_TEMPLATE,
         {"bos_token": None, "eos_token": {"content": "<|im_end|>", "special": True}}),
    ]:
        tok, pat = make(kind, pattern, n, specials, template, extra)
        for t in texts:
            for add_special in (False, True):
                cases.append({"tokenizer": kind, "text": t, "add_special": add_special,
                              "ids": reference_encode(tok, pat, t, add_special)})
    with open(os.path.join(HERE, "data", "bpe_cases.json"), "w") as f:
        json.dump(cases, f, ensure_ascii=True)

    chats = []
    templates = {"llama3": LLAMA3_TEMPLATE, "qwen2": QWEN2_TEMPLATE, "qwen25": QWEN25_TEMPLATE, "misc": MISC_TEMPLATE,
                 "extra": EXTRA_TEMPLATE}
    for name, template in templates.items():
        for conv in CONVERSATIONS + ([TOOL_CONVERSATION] if name == "qwen25" else []):
            for gen in (False, True):
                kw = {"messages": conv, "add_generation_prompt": gen, "bos_token": "<|begin_of_text|>", "eos_token": "</s>"}
                if name == "qwen25" and conv is CONVERSATIONS[0]:
                    kw["tools"] = TOOLS
                try:
                    chats.append({"template": name, **kw, "text": render(template, **kw)})
                except jinja2.exceptions.TemplateError as e:
                    chats.append({"template": name, **kw, "error": str(e)})
    bad = [{"role": "robot", "content": "x"}]
    chats.append({"template": "misc", "messages": bad, "add_generation_prompt": False, "bos_token": "", "eos_token": "",
                  "error": "bad role: robot"})
    with open(os.path.join(HERE, "data", "chat_cases.json"), "w") as f:
        json.dump({"templates": templates, "cases": chats}, f, ensure_ascii=True, indent=0)


main()
