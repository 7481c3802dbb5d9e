#!/usr/bin/env python3
"""Multi-step math word problems with worked solutions, as JSONL for Tessera's sft and
grpo jobs (docs/rl.md, "A reasoning workload").

Each problem takes two to four arithmetic steps (shopping with change, distances at two
speeds, sharing and buying, discounts with a fee, legs on a farm, savings, ages, packing
into boxes, ...). A solution states each step ("4 pencils cost 4 × 3 = 12 dollars.") and
ends with the answer in \\boxed{}, the form the rule verifier reads.

  python3 scripts/make-math-problems.py --out DIR [--train 20000] [--eval 500] [--seed 1]

writes
  DIR/sft.jsonl    {"messages": [user, assistant]}   problem and worked solution (sft)
  DIR/grpo.jsonl   {"messages": [user], "answer"}    the same training problems (grpo)
  DIR/eval.jsonl   {"messages": [user], "answer"}    held-out problems (rl.eval_data)
The held-out problems are disjoint from the training ones: a problem (its template and
numbers) goes to one side by a hash of itself, so no training line repeats one. The
same seed writes the same files.
"""
import argparse
import hashlib
import json
import os
import random

NAMES = [("Maria", "she", "her"), ("Omar", "he", "his"), ("Lena", "she", "her"), ("Kenji", "he", "his"),
         ("Ava", "she", "her"), ("Diego", "he", "his"), ("Priya", "she", "her"), ("Tom", "he", "his"),
         ("Chloe", "she", "her"), ("Yusuf", "he", "his"), ("Nora", "she", "her"), ("Ivan", "he", "his")]
ITEMS = [("pencil", "pencils"), ("notebook", "notebooks"), ("apple", "apples"), ("sandwich", "sandwiches"),
         ("ticket", "tickets"), ("candle", "candles"), ("mug", "mugs"), ("poster", "posters")]
THINGS = [("marble", "marbles"), ("sticker", "stickers"), ("card", "cards"), ("stamp", "stamps"), ("shell", "shells")]
INSTRUCTION = " Solve it step by step and put the final answer in \\boxed{}."


def shopping(r):
    name, she, _ = r.choice(NAMES)
    (i1, i1s), (i2, i2s) = r.sample(ITEMS, 2)
    a, b, p1, p2 = r.randint(2, 9), r.randint(2, 9), r.randint(2, 15), r.randint(2, 15)
    total = a * p1 + b * p2
    bill = next(x for x in (20, 50, 100, 200, 500) if x > total)
    q = (f"{name} buys {a} {i1s} at ${p1} each and {b} {i2s} at ${p2} each. {she.capitalize()} pays with a "
         f"${bill} bill. How much change, in dollars, does {she} get?")
    s = [f"{a} {i1s} cost {a} × {p1} = {a * p1} dollars.", f"{b} {i2s} cost {b} × {p2} = {b * p2} dollars.",
         f"Together they cost {a * p1} + {b * p2} = {total} dollars.",
         f"The change is {bill} - {total} = {bill - total} dollars."]
    return q, s, bill - total


def two_speeds(r):
    v, t1, w, t2 = r.randint(4, 12) * 10, r.randint(2, 5), r.randint(3, 11) * 10, r.randint(1, 4)
    q = (f"A train travels at {v} km per hour for {t1} hours, then at {w} km per hour for {t2} hours. "
         f"How many kilometres does it travel in total?")
    s = [f"In the first part it travels {v} × {t1} = {v * t1} km.", f"In the second part it travels {w} × {t2} = {w * t2} km.",
         f"In total it travels {v * t1} + {w * t2} = {v * t1 + w * t2} km."]
    return q, s, v * t1 + w * t2


def sharing(r):
    name, she, _ = r.choice(NAMES)
    thing, things = r.choice(THINGS)
    k, f = r.randint(2, 8), r.randint(2, 6)
    n = k * f + r.randint(3, 40)
    m = r.randint(5, 30)
    left = n - k * f
    q = (f"{name} has {n} {things}. {she.capitalize()} gives {k} {things} to each of {f} friends, then buys {m} more. "
         f"How many {things} does {she} have now?")
    s = [f"{she.capitalize()} gives away {k} × {f} = {k * f} {things}.", f"That leaves {n} - {k * f} = {left} {things}.",
         f"After buying {m} more, {she} has {left} + {m} = {left + m} {things}."]
    return q, s, left + m


def discount(r):
    name, she, _ = r.choice(NAMES)
    d = r.choice([10, 20, 25, 50])
    p = r.randint(2, 20) * 20
    fee = r.randint(3, 15)
    off = p * d // 100
    q = (f"A jacket costs ${p}. It is on sale for {d}% off, and {name} also pays a ${fee} delivery fee. "
         f"How many dollars does {she} pay in total?")
    s = [f"The discount is {d}% of {p}, which is {p} × {d} / 100 = {off} dollars.",
         f"The sale price is {p} - {off} = {p - off} dollars.",
         f"With the fee {name} pays {p - off} + {fee} = {p - off + fee} dollars."]
    return q, s, p - off + fee


def farm(r):
    c, h, d = r.randint(2, 30), r.randint(2, 40), r.randint(0, 12)
    ducks = f" and {d} ducks" if d else ""
    q = f"A farm has {c} cows, {h} hens{ducks}. How many legs do these animals have altogether?"
    s = [f"The cows have {c} × 4 = {4 * c} legs.", f"The hens have {h} × 2 = {2 * h} legs."]
    total = 4 * c + 2 * h
    if d:
        s.append(f"The ducks have {d} × 2 = {2 * d} legs.")
        s.append(f"Altogether {4 * c} + {2 * h} + {2 * d} = {total + 2 * d} legs.")
        total += 2 * d
    else:
        s.append(f"Altogether {4 * c} + {2 * h} = {total} legs.")
    return q, s, total


def savings(r):
    name, she, her = r.choice(NAMES)
    a, w = r.randint(3, 25), r.randint(3, 12)
    spend = r.randint(5, a * w - 1)
    q = (f"{name} saves ${a} every week for {w} weeks, then spends ${spend} on a game. "
         f"How many dollars of {her} savings are left?")
    s = [f"{she.capitalize()} saves {a} × {w} = {a * w} dollars.", f"After the game {a * w} - {spend} = {a * w - spend} dollars are left."]
    return q, s, a * w - spend


def ages(r):
    name, she, her = r.choice(NAMES)
    x, y, z = r.randint(5, 40), r.randint(1, 15), r.randint(2, 20)
    q = (f"{name} is {x} years old and {her} brother is {y} years older. "
         f"In {z} years, what will the sum of their ages be?")
    s = [f"The brother is {x} + {y} = {x + y} years old.", f"Now their ages add up to {x} + {x + y} = {2 * x + y}.",
         f"In {z} years each is {z} years older, so the sum grows by 2 × {z} = {2 * z}.",
         f"The sum will be {2 * x + y} + {2 * z} = {2 * x + y + 2 * z}."]
    return q, s, 2 * x + y + 2 * z


def boxes(r):
    name, she, _ = r.choice(NAMES)
    k = r.randint(3, 12)
    c = r.randint(2, 8) * k
    b = r.randint(2, 9)
    q = (f"{name} bakes {b} batches of {c} cookies and packs them in boxes of {k}. "
         f"How many boxes does {she} fill?")
    s = [f"{she.capitalize()} bakes {b} × {c} = {b * c} cookies.", f"They fill {b * c} / {k} = {b * c // k} boxes."]
    return q, s, b * c // k


def tickets(r):
    a, c, pa, pc = r.randint(1, 6), r.randint(1, 8), r.randint(8, 20), r.randint(3, 10)
    n = r.randint(2, 5)
    each = a * pa + c * pc
    q = (f"A family buys tickets for {a} adults at ${pa} each and {c} children at ${pc} each. "
         f"They go to the museum {n} times this year. How many dollars do they spend on tickets?")
    s = [f"The adults' tickets cost {a} × {pa} = {a * pa} dollars a visit.", f"The children's cost {c} × {pc} = {c * pc} dollars a visit.",
         f"One visit costs {a * pa} + {c * pc} = {each} dollars.", f"{n} visits cost {each} × {n} = {each * n} dollars."]
    return q, s, each * n


def garden(r):
    rows, per, dead = r.randint(3, 15), r.randint(4, 20), r.randint(1, 10)
    extra = r.randint(2, 30)
    q = (f"A garden has {rows} rows of {per} tulips. {dead} tulips wilt, and the gardener plants {extra} new ones. "
         f"How many tulips are in the garden now?")
    s = [f"At first there are {rows} × {per} = {rows * per} tulips.", f"After {dead} wilt, {rows * per} - {dead} = {rows * per - dead} are left.",
         f"With {extra} new ones there are {rows * per - dead} + {extra} = {rows * per - dead + extra} tulips."]
    return q, s, rows * per - dead + extra


TEMPLATES = [shopping, two_speeds, sharing, discount, farm, savings, ages, boxes, tickets, garden]


def held_out(question):
    """One problem in ten goes to the held-out side, by a hash of the problem itself."""
    return hashlib.sha256(question.encode()).digest()[0] % 10 == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--eval", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    r = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    train, evals, seen = [], [], set()
    while len(train) < a.train or len(evals) < a.eval:
        q, steps, answer = r.choice(TEMPLATES)(r)
        if q in seen:
            continue
        seen.add(q)
        side = evals if held_out(q) else train
        if len(side) < (a.eval if side is evals else a.train):
            side.append((q, steps, answer))
    with open(os.path.join(a.out, "sft.jsonl"), "w") as sft, open(os.path.join(a.out, "grpo.jsonl"), "w") as grpo:
        for q, steps, answer in train:
            user = {"role": "user", "content": q + INSTRUCTION}
            solution = " ".join(steps) + f" The answer is \\boxed{{{answer}}}."
            sft.write(json.dumps({"messages": [user, {"role": "assistant", "content": solution}]}, ensure_ascii=False) + "\n")
            grpo.write(json.dumps({"messages": [user], "answer": str(answer)}, ensure_ascii=False) + "\n")
    with open(os.path.join(a.out, "eval.jsonl"), "w") as ev:
        for q, _, answer in evals:
            ev.write(json.dumps({"messages": [{"role": "user", "content": q + INSTRUCTION}], "answer": str(answer)},
                                ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
