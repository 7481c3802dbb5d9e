#!/usr/bin/env python3
"""Where the decode step's kernels spend their time, from the per-CTA phase records of a
build configured with -DTESSERA_KERNEL_PHASES=ON (kernels/common/phase_probe.h says what a
record holds), as `decode_bench --phases PREFIX` writes them:

  python3 bench/decode_phases.py PREFIX.b1.txt [--top 8]

The records are grouped into launches (a kernel's id and grid, as many records as the grid
has blocks; a launch missing records — the buffer filled — is left out) and ordered by
their first CTA's start. For each pair (kernel before, kernel) it prints the medians, in
microseconds and counted from the end of the kernel before (its last CTA's end), of:
  start      its first CTA's start (negative: it started while the one before ran)
  wait       its first CTA's return from the dependency wait (stamp 2), and the last's
  end        its last CTA's end: what the kernel adds to the chain
and the phases of the CTA that ended last (the critical one): t1-t0 before the wait
(the weights' or tiles' first loads issued), t2-t1 in the wait, then the kernel's own
points up to its end (t7). Keep runs short (decode_bench --new 32 at batch 1) so the
buffer holds every record of the traced Generate().
"""
import argparse
import collections
import statistics
import sys


def name(kid, grid):
    if kid in (164, 228):
        return f"attention d{kid - 100} g{grid}"
    parts = []
    rest = kid
    if rest >= 200:
        parts.append("residual")
        rest -= 200
    if rest >= 100:
        parts.append("norm")
        rest -= 100
    swiglu = rest % 10 >= 5
    if swiglu:
        parts.append("swiglu")
        rest -= 5
    m, ks = rest // 10, rest % 10
    return f"linear m{m} ks{ks}{' ' + '+'.join(parts) if parts else ''} g{grid}"


def launches(recs):
    recs = sorted(recs, key=lambda r: r[3][0])
    out, open_ = [], {}
    for r in recs:
        key = (r[0], r[2])
        cur = open_.get(key)
        if cur is None or len(cur["r"]) >= r[2]:
            cur = {"key": key, "r": []}
            open_[key] = cur
            out.append(cur)
        cur["r"].append(r)
    out = [x for x in out if len(x["r"]) == x["key"][1]]
    out.sort(key=lambda x: min(r[3][0] for r in x["r"]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args()
    recs = []
    with open(a.records) as f:
        for line in f:
            v = line.split()
            if len(v) != 11:
                sys.exit(f"{a.records}: a record has 11 fields (id block grid t0..t7), got {len(v)}: {line.strip()!r}")
            recs.append((int(v[0]), int(v[1]), int(v[2]), [int(x) for x in v[3:]]))
    ls = launches(recs)
    st = collections.defaultdict(lambda: collections.defaultdict(list))
    for prev, cur in zip(ls, ls[1:]):
        pe = max(r[3][7] for r in prev["r"])
        rs = cur["r"]
        d = st[(name(*prev["key"]), name(*cur["key"]))]
        d["start"].append(min(r[3][0] for r in rs) - pe)
        d["first wait"].append(min(r[3][2] for r in rs if r[3][2]) - pe if any(r[3][2] for r in rs) else 0)
        d["last wait"].append(max(r[3][2] for r in rs) - pe)
        d["end"].append(max(r[3][7] for r in rs) - pe)
        t = max(rs, key=lambda r: r[3][7])[3]
        prev_i = 0
        for i in range(1, 8):
            if t[i] and t[prev_i]:
                d[f"t{i}-t{prev_i}"].append(t[i] - t[prev_i])
                prev_i = i
    print(f"{len(ls)} complete launches of {len(recs)} records")
    rows = sorted(st.items(), key=lambda kv: -len(kv[1]["end"]) * statistics.median(kv[1]["end"]))
    for (p, k), d in rows[: a.top]:
        print(f"{p} -> {k}  ({len(d['end'])} launches)")
        print("  " + "  ".join(f"{key} {statistics.median(v) / 1e3:.2f}" for key, v in d.items()))


if __name__ == "__main__":
    main()
