#!/usr/bin/env python3
"""A code-answer checker: a RewardService (proto/tessera/v1/reward_service.proto) for a job
with `rl: {reward_service: 127.0.0.1:PORT}` whose prompts ask for a program and whose
answers are the program's expected output (JSONL {"prompt", "answer"} lines).

Each completion's last ```python block (or, without one, the whole completion) runs in a
child `python3 -I` in an empty temporary directory, with limits on CPU time, memory, file
size and processes; its standard output, stripped, is compared with the reference answer:
reward 1 when equal, 0 otherwise (a crash, a time-out or no code is 0). The model's code
runs here, in this server — never in Tessera's daemons; run it where that is acceptable.

    python3 examples/servers/code_reward.py --listen 127.0.0.1:50062
"""
import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tessera_protos  # noqa: E402

BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def code_of(completion):
    blocks = BLOCK.findall(completion)
    return blocks[-1] if blocks else completion


def run(code, timeout_s, memory_mb):
    """The program's stripped standard output, or None (an error, a time-out)."""
    def limits():
        resource.setrlimit(resource.RLIMIT_CPU, (int(timeout_s) + 1, int(timeout_s) + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))
    with tempfile.TemporaryDirectory(prefix="code-reward-") as d:
        try:
            p = subprocess.run([sys.executable, "-I", "-c", code], cwd=d, stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=timeout_s, preexec_fn=limits,
                               env={"PATH": "/usr/bin:/bin"})
        except (subprocess.TimeoutExpired, ValueError):
            return None
    if p.returncode != 0:
        return None
    return p.stdout.decode("utf-8", "replace").strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:50062", help="host:port (port 0: any free port)")
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds per program")
    ap.add_argument("--memory-mb", type=int, default=256)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="programs run at once")
    args = ap.parse_args()
    (rw,) = tessera_protos.load("reward_service")
    pool = futures.ThreadPoolExecutor(max_workers=args.workers)

    def score(req, _ctx):
        def one(s):
            out = run(code_of(s.completion.decode("utf-8", "replace")), args.timeout, args.memory_mb)
            return 1.0 if out is not None and out == s.reference.decode("utf-8", "replace").strip() else 0.0
        resp = rw.ScoreResponse()
        resp.rewards.extend(pool.map(one, req.samples))
        return resp

    tessera_protos.serve([tessera_protos.handler("tessera.v1.RewardService", {
        "Score": (score, rw.ScoreRequest, rw.ScoreResponse)})], args.listen)


if __name__ == "__main__":
    main()
