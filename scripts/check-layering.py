#!/usr/bin/env python3
"""Checks that #include dependencies between the source folders run one way.

Every folder of the system is one module (one CMake library); each may include its own
headers, those of the modules it depends on (directly or through another module), and
third-party headers. An include of a module that is not below it is an error naming the
file, the line and the rule. docs/design.md (Repository layout) draws the same graph.

  check-layering.py SOURCE_DIR [--stamp FILE]

Exit status 0 when the tree keeps the layering (the stamp file is then written, for the
build), 1 when it does not, 2 on bad usage.
"""
import os
import re
import sys

# module -> the modules it may include directly (it may also include what those may).
# "proto" is the generated code under tessera/ (proto/tessera/v1/*.proto).
LAYERS = {
    "common": [],                                   # status, dtype, util, logging, rl math, GPU discovery
    "common/parallel": ["common"],                  # rank layout, pipeline schedules
    "common/model": ["common", "common/parallel"],  # model shapes, Hugging Face config.json
    "proto": [],
    "common/spec": ["common", "common/parallel", "proto"],   # job files <-> JobSpec, bounds, paths
    "common/plan": ["common/spec", "common/model"],           # per-rank memory and comm plan
    "common/rpc": ["common", "proto"],                        # channels, TLS, tokens, status <-> gRPC
    "kernels": ["common"],
    "worker/runtime": ["kernels"],
    "worker/comm": ["worker/runtime", "common/parallel", "common/rpc"],
    "worker/tokenizer": ["common"],
    "worker/model": ["worker/comm", "common/model"],
    "worker/train": ["worker/model", "worker/tokenizer"],    # trainer, ZeRO, pipelines, data
    "worker/rollout": ["worker/model"],                      # generation, weight sync
    "worker/rl": ["worker/train", "worker/rollout"],         # GRPO / PPO steps
    "worker/checkpoint": ["worker/train"],
    "worker/executor": ["worker/checkpoint", "worker/rl", "common/spec", "common/rpc"],
    "worker/agent": ["common/rpc", "common/spec"],
    "worker": ["worker/executor", "worker/agent"],  # worker/main.cc: the tessera-worker binary
    "controller": ["common/plan", "common/rpc"],
    "client": ["controller", "worker/agent"],       # `tessera local` embeds a controller and an agent
}

# Folders outside the module graph: tests and benchmarks may include anything (each links
# only the modules it exercises); the fuzz targets likewise.
SKIP = ("tests/", "bench/", "fuzz/", "examples/", "build", "dist", "deploy/", "docs/", "scripts/", ".")

SOURCE_EXT = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def closure(layers):
    below = {}

    def visit(m, seen):
        for d in layers[m]:
            if d not in seen:
                seen.add(d)
                visit(d, seen)
        return seen

    for m in layers:
        below[m] = visit(m, set())
    return below


def module_of(path, modules):
    """The longest module folder that holds `path` (a path relative to the root)."""
    best = None
    for m in modules:
        if m == "proto":
            continue
        if path.startswith(m + "/") and (best is None or len(m) > len(best)):
            best = m
    return best


def included_module(inc, modules):
    if inc.startswith("tessera/"):
        return "proto"
    return module_of(inc, modules)


def check(root, layers):
    for m, deps in layers.items():
        for d in deps:
            if d not in layers:
                return [f"layer table: {m} depends on unknown module {d}"]
    below = closure(layers)
    for m in layers:
        if m in below[m]:
            return [f"layer table: {m} depends on itself (a cycle)"]
    errors = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir != "." and (rel_dir + "/").startswith(SKIP):
            dirnames[:] = []
            continue
        for name in sorted(filenames):
            if not name.endswith(SOURCE_EXT):
                continue
            rel = os.path.normpath(os.path.join(rel_dir, name))
            owner = module_of(rel, layers)
            if owner is None:
                continue
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    mt = INCLUDE.match(line)
                    if not mt:
                        continue
                    target = included_module(mt.group(1), layers)
                    if target is None or target == owner or target in below[owner]:
                        continue
                    errors.append(f"{rel}:{lineno}: {owner} may not include {mt.group(1)} "
                                  f"(module {target} is not below it)")
    return errors


def main(argv):
    args = argv[1:]
    stamp = None
    if "--stamp" in args:
        i = args.index("--stamp")
        if i + 1 >= len(args):
            print("usage: check-layering.py SOURCE_DIR [--stamp FILE]", file=sys.stderr)
            return 2
        stamp = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1 or not os.path.isdir(args[0]):
        print("usage: check-layering.py SOURCE_DIR [--stamp FILE]", file=sys.stderr)
        return 2
    errors = check(args[0], LAYERS)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"layering: {len(errors)} include(s) against the module order (scripts/check-layering.py)",
              file=sys.stderr)
        return 1
    if stamp:
        with open(stamp, "w") as f:
            f.write("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
