#!/usr/bin/env python3
"""A calculator tool for multi-turn rollouts: an EnvironmentService
(proto/tessera/v1/environment_service.proto) for a job with

    rl: {environment: 127.0.0.1:PORT, tool_stop: ")", max_turns: 2, ...}

A model turn that ends with ")" is a call: the calculator evaluates the arithmetic inside
the call's last parenthesized group (integers, + - * and parentheses; no eval) and answers "[value]"
— or "[error]" — which the job appends to the response; the model then writes its answer.
Per-session state: the calls of each episode are counted (a session that calls more than
--max-calls times is told done) and dropped when End names the session.

    python3 examples/servers/calculator_env.py --listen 127.0.0.1:50061
"""
import argparse
import os
import re
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tessera_protos  # noqa: E402

TOKEN = re.compile(r"\s*(\d+|[-+*()])")


def evaluate(text):
    """The value of an integer expression of + - * and parentheses; ValueError otherwise."""
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            raise ValueError("unexpected %r" % text[pos:])
        tokens.append(m.group(1))
        pos = m.end()
    at = [0]

    def peek():
        return tokens[at[0]] if at[0] < len(tokens) else None

    def take():
        at[0] += 1
        return tokens[at[0] - 1]

    def atom():
        t = take() if peek() is not None else None
        if t == "(":
            v = expr()
            if take() != ")":
                raise ValueError("unbalanced")
            return v
        if t == "-":
            return -atom()
        if t is None or not t.isdigit() or len(t) > 18:
            raise ValueError("expected a number")
        return int(t)

    def term():
        v = atom()
        while peek() == "*":
            take()
            v *= atom()
        return v

    def expr():
        v = term()
        while peek() in ("+", "-"):
            v = v + term() if take() == "+" else v - term()
        return v

    v = expr()
    if peek() is not None:
        raise ValueError("trailing %r" % peek())
    return v


def answer(call):
    """The observation of a call's text: the value of its last "( ... )" (the "(" that the
    final ")" closes), in brackets."""
    close = call.rfind(")")
    open_, depth = -1, 0
    for i in range(close, -1, -1):
        depth += {")": 1, "(": -1}.get(call[i], 0)
        if depth == 0:
            open_ = i
            break
    if close < 0 or open_ < 0:
        return "[error]"
    try:
        return "[%d]" % evaluate(call[open_ + 1:close])
    except (ValueError, IndexError, RecursionError):
        return "[error]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:50061", help="host:port (port 0: any free port)")
    ap.add_argument("--max-calls", type=int, default=4, help="calls per episode before it is ended")
    args = ap.parse_args()
    (env,) = tessera_protos.load("environment_service")
    lock = threading.Lock()
    calls = {}  # session -> calls so far

    def step(req, _ctx):
        resp = env.EnvStepResponse()
        for c in req.calls:
            with lock:
                n = calls[c.session] = calls.get(c.session, 0) + 1
            obs = resp.observations.add()
            if n > args.max_calls:
                obs.done = True
            else:
                obs.text = answer(c.call.decode("utf-8", "replace")).encode()
        return resp

    def end(req, _ctx):
        with lock:
            for s in req.sessions:
                calls.pop(s, None)
        return env.EnvEndResponse()

    tessera_protos.serve([tessera_protos.handler("tessera.v1.EnvironmentService", {
        "Step": (step, env.EnvStepRequest, env.EnvStepResponse),
        "End": (end, env.EnvEndRequest, env.EnvEndResponse)})], args.listen)


if __name__ == "__main__":
    main()
