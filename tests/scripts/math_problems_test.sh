#!/usr/bin/env bash
# scripts/make-math-problems.py: the files it promises, every worked step's arithmetic
# right, each solution's \boxed{} answer the one grpo's line names, no held-out problem
# among the training ones, and the same seed writing the same bytes (another seed not).
set -euo pipefail
src=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 "$src/scripts/make-math-problems.py" --out "$dir/a" --train 600 --eval 80 --seed 3
python3 "$src/scripts/make-math-problems.py" --out "$dir/b" --train 600 --eval 80 --seed 3
python3 "$src/scripts/make-math-problems.py" --out "$dir/c" --train 600 --eval 80 --seed 4
cmp "$dir/a/sft.jsonl" "$dir/b/sft.jsonl"
cmp "$dir/a/eval.jsonl" "$dir/b/eval.jsonl"
! cmp -s "$dir/a/sft.jsonl" "$dir/c/sft.jsonl"
python3 - "$dir/a" <<'PY'
import json, re, sys
d = sys.argv[1]
sft = [json.loads(l) for l in open(f"{d}/sft.jsonl")]
grpo = [json.loads(l) for l in open(f"{d}/grpo.jsonl")]
ev = [json.loads(l) for l in open(f"{d}/eval.jsonl")]
assert len(sft) == len(grpo) == 600 and len(ev) == 80, (len(sft), len(grpo), len(ev))
steps = 0
for s, g in zip(sft, grpo):
    user, solution = s["messages"]
    assert user["role"] == "user" and solution["role"] == "assistant"
    assert g["messages"] == [user] and "\\boxed{}" in user["content"]
    found = re.findall(r"((?:\d+ [×+\-/] )+\d+) = (\d+)", solution["content"])
    assert len(found) >= 2, solution["content"]  # several steps
    for expr, value in found:
        steps += 1
        exact = eval(expr.replace("×", "*"))  # true division: a remainder fails
        assert exact == int(value), (expr, value, solution["content"])
    boxed = re.findall(r"\\boxed\{([^}]*)\}", solution["content"])
    assert boxed == [g["answer"]], (boxed, g["answer"])
    assert found[-1][1] == g["answer"], (found[-1], g["answer"])
train = {g["messages"][0]["content"] for g in grpo}
held = {e["messages"][0]["content"] for e in ev}
assert len(train) == 600 and len(held) == 80 and not (train & held)
print(f"{steps} worked steps checked")
PY
