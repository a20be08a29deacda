#!/usr/bin/env python3
"""A/B of two rdma-tool builds, back to back on one machine.

Runs each benchmark command with build A, then with build B, for ROUNDS rounds (A, B, A,
B, ...: both see the same load drift), reads the `--json` lines, and prints for each row the
median over the rounds of its main figure (latency: median_ns, bandwidth: gbps, rate: mops)
for A and B, and B/A (below 1 is B faster for latencies, above 1 for the others).
`bench reg` rows (name, value, unit) are compared by their value.

    scripts/ab-bench.py --rounds 3 A/rdma-tool B/rdma-tool \
        "bench data --op write,read --size 8 --transport tcp --iters 5000 --no-ucx"
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys

FIGURE = {"latency": "median_ns", "bandwidth": "gbps", "rate": "mops"}


def run(tool, command):
    out = subprocess.run([tool, *shlex.split(command), "--json"], capture_output=True,
                         text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "name" in r:  # bench reg: a named value with its unit
            rows[("", r["name"], r["unit"], "")] = r["value"]
            continue
        key = (r["transport"], r["op"], r["metric"], r["size"])
        rows[key] = r[FIGURE.get(r["metric"], "median_ns")]
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("commands", nargs="+")
    args = p.parse_args()
    for command in args.commands:
        got = {"A": {}, "B": {}}
        for _ in range(args.rounds):
            for side, tool in (("A", args.a), ("B", args.b)):
                for key, v in run(tool, command).items():
                    got[side].setdefault(key, []).append(v)
        print(f"## {command} ({args.rounds} rounds)")
        print("| transport | op | metric | size | A | B | B/A |")
        print("|---|---|---|---|---|---|---|")
        for key in got["A"]:
            if key not in got["B"]:
                continue
            a, b = statistics.median(got["A"][key]), statistics.median(got["B"][key])
            ratio = b / a if a else float("nan")
            print(f"| {' | '.join(map(str, key))} | {a:.4g} | {b:.4g} | {ratio:.2f} |")
        print()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
