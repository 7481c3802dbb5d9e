#!/usr/bin/env python3
"""Runs benchmark suites on a GPU host and prints one table per suite.

A suite is data (bench/suites/<name>.json):
  title     what it measures
  vars      names substituted into the commands as $NAME
  runs      [{id, cmd, timeout (s), min_gpus}]: each command prints JSON lines on stdout
            (other lines are ignored); its records are kept under its id. A run needing
            more GPUs than the host has is skipped (its rows say so).
  rows      [{name, tessera, peer, better, limit, for_each}]:
            tessera / peer  {run, where: {key: value}, metric, label}: the records of run
                            `run` whose keys equal `where` (a value "{each}" stands for the
                            row's for_each value); a peer with several records (variants)
                            counts its best, named by its `label` key.
            better          "higher" (tokens/s) or "lower" (ms): the ratio is Tessera's
                            advantage (> 1: Tessera is ahead).
            limit           [{metric, max, what}]: the first whose metric the Tessera
                            record has gives the fraction of the hardware limit; max is a
                            number, the name of a card constant ("hbm_gbps"), or a record
                            reference {run, where, metric} (e.g. the measured device copy).
            for_each        a key: one row per distinct value of it in the Tessera run.
Usage (on the GPU host, dist/ unpacked — scripts/gpu-bench.sh does that):
  python3 bench/suites.py [--out DIR] SUITE...      (SUITE: kernels, train, scale, decode, decode_gemm, decode_ab, rl, rl_long, rl_math, rl_math_ppo, rl_async, rl_reward, rl_offload, rl_tools, prefix, rl_math4, rl_math4_ppo, rollout_rl, tokenizers, qwen3, qwen25_7b)
  python3 bench/suites.py --check                   (every suite's rows name runs it has; runs nothing)
Every run's stdout and stderr land in DIR; the tables go to stdout and DIR/<suite>.md.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Measured limits per card (docs/perf.md): HBM copy, bf16 dense GEMM ceiling.
CARDS = {"H200": {"hbm_gbps": 4300.0, "gemm_tflops": 790.0}, "H100": {"hbm_gbps": 3000.0, "gemm_tflops": 790.0}}


def card_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        names = [l.strip() for l in out.stdout.splitlines() if l.strip()]
        return names[0] if names else "no GPU", len(names)
    except OSError:
        return "no GPU", 0


def constants(card):
    for k, v in CARDS.items():
        if k in card:
            return v
    return CARDS["H100"]


def expand(cmd, vars_):
    for k, v in sorted(vars_.items(), key=lambda kv: -len(kv[0])):
        cmd = cmd.replace("$" + k, v)
    return cmd


def run_suite_commands(suite, name, out, gpus):
    records, notes = {}, {}
    for r in suite["runs"]:
        rid = r["id"]
        if gpus < r.get("min_gpus", 1):
            notes[rid] = f"needs {r.get('min_gpus', 1)} GPUs"
            continue
        cmd = expand(r["cmd"], suite.get("vars", {}))
        log = os.path.join(out, f"{name}.{rid}")
        t0 = time.time()
        try:
            p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=r.get("timeout", 300))
            rc, stdout, stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        open(log + ".out", "w").write(stdout)
        open(log + ".err", "w").write(stderr)
        recs = []
        for line in stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        records[rid] = recs
        print(f"[{name}] {rid}: exit {rc}, {len(recs)} records, {time.time() - t0:.0f} s  ({cmd})", file=sys.stderr, flush=True)
        if rc != 0:
            notes[rid] = f"exit {rc}"
            tail = [l for l in stderr.splitlines() if l.strip()][-3:]
            for l in tail:
                print(f"[{name}] {rid}:   {l[:200]}", file=sys.stderr)
    return records, notes


def select(records, ref, each=None):
    want = {k: (each if v == "{each}" else v) for k, v in ref.get("where", {}).items()}
    return [r for r in records.get(ref["run"], []) if all(r.get(k) == v for k, v in want.items())
            and isinstance(r.get(ref["metric"]), (int, float)) and "error" not in r]


def pick(cands, metric, better):
    if not cands:
        return None
    return max(cands, key=lambda r: r[metric]) if better == "higher" else min(cands, key=lambda r: r[metric])


def resolve_max(m, records, consts):
    if isinstance(m, (int, float)):
        return float(m)
    if isinstance(m, str):
        return consts.get(m)
    got = pick(select(records, m), m["metric"], "higher")
    return float(got[m["metric"]]) if got else None


def fmt(v):
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def build_rows(suite, records, notes, consts):
    rows = []
    for spec in suite["rows"]:
        eaches = [None]
        if spec.get("for_each"):
            seen = []
            for r in records.get(spec["tessera"]["run"], []):
                v = r.get(spec["for_each"])
                if v is not None and v not in seen:
                    seen.append(v)
            eaches = seen or [None]
        for each in eaches:
            name = spec["name"].replace("{each}", str(each)) if each is not None else spec["name"]
            better = spec.get("better", "higher")
            t_ref, p_ref = spec["tessera"], spec.get("peer")
            ours = pick(select(records, t_ref, each), t_ref["metric"], better)
            peer = pick(select(records, p_ref, each), p_ref["metric"], better) if p_ref else None
            tv = ours[t_ref["metric"]] if ours else None
            pv = peer[p_ref["metric"]] if peer else None
            ratio = None
            if tv and pv:
                ratio = tv / pv if better == "higher" else pv / tv
            frac, what = None, ""
            for lim in spec.get("limit", []):
                if ours and isinstance(ours.get(lim["metric"]), (int, float)):
                    mx = resolve_max(lim["max"], records, consts)
                    if mx:
                        frac, what = ours[lim["metric"]] / mx, lim.get("what", "")
                    break
            why = ""
            if ours is None:
                why = notes.get(t_ref["run"], "no record")
            peer_label = "—"
            if p_ref:
                if peer is None:
                    peer_label = notes.get(p_ref["run"], "no record")
                else:
                    lab = peer.get(p_ref.get("label", ""), "")
                    peer_label = f"{fmt(pv)}" + (f" ({lab})" if lab else "")
            rows.append({"benchmark": name, "unit": spec.get("unit", t_ref["metric"]),
                         "tessera": fmt(tv) if ours else f"— ({why})", "peer": peer_label,
                         "ratio": f"{ratio:.2f}x" if ratio else "—",
                         "limit": f"{frac:.0%} {what}".strip() if frac is not None else "—"})
    return rows


def table(rows):
    cols = [("benchmark", "benchmark"), ("unit", "unit"), ("tessera", "Tessera"), ("peer", "peer"), ("ratio", "ratio"),
            ("limit", "of limit")]
    widths = {k: max(len(h), *(len(r[k]) for r in rows)) for k, h in cols} if rows else {k: len(h) for k, h in cols}
    text = "  ".join(h.ljust(widths[k]) for k, h in cols) + "\n"
    text += "\n".join("  ".join(r[k].ljust(widths[k]) for k, _ in cols) for r in rows)
    md = "| " + " | ".join(h for _, h in cols) + " |\n|" + "---|" * len(cols) + "\n"
    md += "\n".join("| " + " | ".join(r[k] for k, _ in cols) + " |" for r in rows)
    return text, md


def check(suite, name):
    """The problems of a suite's definition (empty when it is well formed)."""
    bad = []
    runs = {r.get("id") for r in suite.get("runs", [])}
    for k in ("title", "runs", "rows"):
        if k not in suite:
            bad.append(f"{name}: no '{k}'")
    for r in suite.get("runs", []):
        if not r.get("id") or not r.get("cmd"):
            bad.append(f"{name}: a run without id or cmd")
    for row in suite.get("rows", []):
        for side in ("tessera", "peer"):
            ref = row.get(side)
            if ref is None:
                if side == "tessera":
                    bad.append(f"{name}: row '{row.get('name')}' has no tessera side")
                continue
            if ref.get("run") not in runs:
                bad.append(f"{name}: row '{row.get('name')}' {side} names run '{ref.get('run')}', not in the suite")
            if not ref.get("metric"):
                bad.append(f"{name}: row '{row.get('name')}' {side} has no metric")
        if row.get("better", "higher") not in ("higher", "lower"):
            bad.append(f"{name}: row '{row.get('name')}' better must be higher or lower")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/tessera-gpu-out"))
    ap.add_argument("--dir", default=os.path.join(HERE, "suites"), help="where the suites are")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--gpus", type=int, help="the GPUs runs may use (default: every visible one)")
    ap.add_argument("suites", nargs="*")
    a = ap.parse_args()
    known = sorted(f[:-5] for f in os.listdir(a.dir) if f.endswith(".json"))
    if a.check:
        bad = []
        for name in a.suites or known:
            bad += check(json.load(open(os.path.join(a.dir, name + ".json"))), name)
        print("\n".join(bad) if bad else f"{len(a.suites or known)} suites well formed")
        return 1 if bad else 0
    if not a.suites:
        ap.error(f"name the suites to run: {', '.join(known)}")
    os.makedirs(a.out, exist_ok=True)
    card, gpus = card_name()
    if a.gpus is not None:
        gpus = a.gpus
    consts = constants(card)
    tables = []
    for name in a.suites:
        path = os.path.join(a.dir, name + ".json")
        if not os.path.exists(path):
            print(f"unknown suite '{name}'; suites: {', '.join(known)}", file=sys.stderr)
            return 2
        suite = json.load(open(path))
        bad = check(suite, name)
        if bad:
            print("\n".join(bad), file=sys.stderr)
            return 2
        records, notes = run_suite_commands(suite, name, a.out, gpus)
        json.dump(records, open(os.path.join(a.out, f"{name}.records.json"), "w"), indent=1)
        rows = build_rows(suite, records, notes, consts)
        text, md = table(rows)
        head = f"== {name}: {suite['title']} — {gpus} x {card}"
        open(os.path.join(a.out, f"{name}.md"), "w").write(f"{head}\n\n{md}\n")
        tables.append(f"{head}\n{text}")
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
