#!/usr/bin/env python3
"""Where a training step's time goes on each GPU, from Nsight Systems reports exported to
SQLite (`nsys export --type sqlite`) of bench/train_bench runs — or from train_bench's own CUPTI traces (`--trace PREFIX`: give PREFIX, which
reads PREFIX.rank*.csv, or one .csv) where the host's nsys records no CUDA work: for every
process (one per rank and GPU), its last "timed step" range (train_bench marks each
step), and in it:
  - the step's span, and the compute stream's busy time (the stream with the most
    non-NCCL kernel time) and idle time, with the longest idle gaps (where in the step,
    and between which kernels);
  - NCCL kernel time, and how much of it ran while the compute stream was busy;
  - compute kernel time by kind (GEMM, attention, the rest), to set against another
    report (one GPU alone against dp4: what the overlap slows down).

  python3 bench/nsys_gaps.py alone.sqlite dp4.sqlite [--gaps 8] [--min-gap-ms 0.1] [--kernels 25]

With --chrome FILE, also every process's last timed step as a Chrome trace (JSON; open it
in Perfetto or chrome://tracing: a track per process and stream).
With --kernels N, also the N kernels of most total time in that step (first process),
with their share, count and mean (what `nsys stats --report cuda_gpu_kern_sum` gives, for
hosts whose nsys lacks `stats`).
"""
import argparse
import csv
import glob
import re
import sqlite3
import sys


def pid_of(global_id):
    return (global_id >> 24) & 0xFFFFFF


def kind(name):
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if "nvjet" in n or "gemm" in n or "cutlass" in n or "xmma" in n:
        return "gemm"
    if "attn" in n or "attention" in n or "flash" in n or "fmha" in n or "cudnn" in n:
        return "attention"
    if n.startswith("memcpy") or n.startswith("memset"):
        return "copy"
    return "other"


def union(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def overlap(a, b):  # total length of the intersection of two unions of intervals
    i = j = 0
    total = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, e - s)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def load_trace(path):
    """CUPTI traces (bench/cupti_trace.h): a file per rank; the rank stands for the pid."""
    files = [path] if path.endswith(".csv") else sorted(glob.glob(glob.escape(path) + ".rank*.csv"))
    if not files:
        raise sqlite3.OperationalError(f"no trace files {path}.rank*.csv")
    steps, kernels = {}, {}
    for i, f in enumerate(files):
        m = re.search(r"\.rank(\d+)\.csv$", f)
        pid = int(m.group(1)) if m else i
        for row in csv.DictReader(open(f, newline="")):
            start, end = int(row["start_ns"]), int(row["end_ns"])
            if row["kind"] == "range":
                if row["name"] == "timed step":
                    steps.setdefault(pid, []).append((start, end))
            else:
                kernels.setdefault(pid, []).append((start, end, int(row["device"]), int(row["stream"]), row["name"]))
    return steps, kernels


def load(path):
    if not path.endswith(".sqlite"):
        return load_trace(path)
    db = sqlite3.connect(path)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:  # seen with the GPU hosts' nsys
        raise sqlite3.OperationalError("no CUDA kernels in the report (CUPTI_ACTIVITY_KIND_KERNEL missing): "
                                       "the CUDA trace did not attach; see the profile log")
    names = dict(db.execute("SELECT id, value FROM StringIds"))
    cols = {r[1] for r in db.execute("PRAGMA table_info(NVTX_EVENTS)")}
    text = "COALESCE(text, '')" if "textId" not in cols else "COALESCE(text, (SELECT value FROM StringIds WHERE id = textId), '')"
    steps = {}
    for start, end, t, tid in db.execute(f"SELECT start, end, {text}, globalTid FROM NVTX_EVENTS WHERE end IS NOT NULL"):
        if t == "timed step":
            steps.setdefault(pid_of(tid), []).append((start, end))
    kernels = {}
    for start, end, dev, stream, pid, name in db.execute(
            "SELECT start, end, deviceId, streamId, globalPid, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL"):
        kernels.setdefault(pid_of(pid), []).append((start, end, dev, stream, names.get(name, str(name))))
    return steps, kernels


def top_kernels(ks, n):
    by_name = {}
    for k in ks:
        t, c = by_name.get(k[4], (0, 0))
        by_name[k[4]] = (t + k[1] - k[0], c + 1)
    total = sum(t for t, _ in by_name.values())
    print(f"    kernel time in the step: {total / 1e6:.2f} ms; by kernel:")
    for name, (t, c) in sorted(by_name.items(), key=lambda x: -x[1][0])[:n]:
        print(f"      {100 * t / total:5.1f}% {t / 1e6:8.2f} ms {c:6d}x {t / c / 1e3:9.1f} us  {name[:90]}")


def chrome_events(path, steps, kernels):
    """The last timed step of each process as Chrome trace events (us; pid = process)."""
    events = []
    for pid in sorted(steps):
        s0, s1 = max(steps[pid])
        label = f"{path} pid {pid}"
        events.append({"name": "process_name", "ph": "M", "pid": label, "args": {"name": label}})
        events.append({"name": "timed step", "ph": "X", "pid": label, "tid": "host", "ts": 0, "dur": (s1 - s0) / 1e3})
        for start, end, dev, stream, name in kernels.get(pid, []):
            if s0 <= start < s1:
                events.append({"name": name[:120], "cat": kind(name), "ph": "X", "pid": label,
                               "tid": f"device {dev} stream {stream}", "ts": (start - s0) / 1e3, "dur": (end - start) / 1e3})
    return events


def report(path, gaps, min_gap_ms, kernels_top=0, chrome=None):
    steps, kernels = load(path)
    if chrome is not None:
        chrome.extend(chrome_events(path, steps, kernels))
    print(f"== {path}")
    if not steps:
        print("  no 'timed step' NVTX ranges (train_bench built without them?)")
        return
    for pid in sorted(steps):
        s0, s1 = max(steps[pid])  # the last timed step
        ks = [k for k in kernels.get(pid, []) if s0 <= k[0] < s1]
        if not ks:
            print(f"  pid {pid}: no kernels in its last timed step")
            continue
        by_stream = {}
        for k in ks:
            if kind(k[4]) != "nccl":
                by_stream[k[3]] = by_stream.get(k[3], 0) + k[1] - k[0]
        if not by_stream:
            print(f"  pid {pid}: only NCCL kernels in its last timed step")
            continue
        compute = max(by_stream, key=by_stream.get)
        comp = sorted(k for k in ks if k[3] == compute)
        busy = union([(k[0], k[1]) for k in comp])
        nccl = union([(k[0], k[1]) for k in ks if kind(k[4]) == "nccl"])
        first, last = comp[0][0], max(k[1] for k in comp)
        span = last - first
        busy_ns = sum(e - s for s, e in busy)
        by_kind = {}
        for k in comp:
            by_kind[kind(k[4])] = by_kind.get(kind(k[4]), 0) + k[1] - k[0]
        print(f"  pid {pid} (device {comp[0][2]}): compute stream {span / 1e6:.2f} ms from its first to its last kernel, "
              f"busy {busy_ns / 1e6:.2f} ms, idle {(span - busy_ns) / 1e6:.2f} ms; NCCL kernels "
              f"{sum(e - s for s, e in nccl) / 1e6:.2f} ms, {overlap(busy, nccl) / 1e6:.2f} ms of it under compute")
        print("    compute kernels: " + ", ".join(f"{k} {v / 1e6:.2f} ms" for k, v in sorted(by_kind.items(), key=lambda x: -x[1])))
        # The step as the host saw it (the range) against the device's span: the head is
        # the host's work before its first kernel, the tail the wait after the last one.
        print(f"    host step {(s1 - s0) / 1e6:.2f} ms: {(first - s0) / 1e6:.2f} ms before the first kernel, "
              f"{(s1 - last) / 1e6:.2f} ms after the last")
        # Idle between consecutive kernels by size: launch latency (many tiny gaps) or the
        # host (a few long ones, e.g. after a host read).
        buckets = [(2e3, "<2us"), (5e3, "2-5us"), (20e3, "5-20us"), (100e3, "20-100us"), (float("inf"), ">=100us")]
        hist = {name: [0, 0] for _, name in buckets}
        for a, b in zip(comp, comp[1:]):
            g = b[0] - max(a[1], first)
            if g <= 0:
                continue
            name = next(n for lim, n in buckets if g < lim)
            hist[name][0] += 1
            hist[name][1] += g
        print("    idle between kernels: " + ", ".join(f"{n} {c}x {t / 1e6:.2f} ms" for n, (c, t) in hist.items()))
        holes = []
        for a, b in zip(comp, comp[1:]):
            if b[0] - a[1] >= min_gap_ms * 1e6:
                holes.append((b[0] - a[1], a[1] - first, a[4], b[4]))
        holes.sort(reverse=True)
        idle_in_holes = sum(h[0] for h in holes)
        print(f"    {len(holes)} gaps of {min_gap_ms} ms or more, {idle_in_holes / 1e6:.2f} ms in all; the longest:")
        for length, at, before, after in holes[:gaps]:
            print(f"      {length / 1e6:7.3f} ms at {at / 1e6:8.2f} ms: {before[:48]} -> {after[:48]}")
        if kernels_top:
            top_kernels(ks, kernels_top)
            kernels_top = 0  # the first process only


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("reports", nargs="+")
    p.add_argument("--gaps", type=int, default=8)
    p.add_argument("--min-gap-ms", type=float, default=0.1)
    p.add_argument("--kernels", type=int, default=0)
    p.add_argument("--chrome", help="write the steps as a Chrome trace (JSON) here")
    a = p.parse_args()
    events = [] if a.chrome else None
    for r in a.reports:
        try:
            report(r, a.gaps, a.min_gap_ms, a.kernels, events)
        except sqlite3.Error as e:
            print(f"== {r}: {e}", file=sys.stderr)
    if a.chrome:
        import json
        with open(a.chrome, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
        print(f"chrome trace: {a.chrome} ({len(events)} events)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
