#!/usr/bin/env python3
"""Runs one rdma-tool benchmark several times and prints each row's spread, with the load.

For each row of the `--json` output (transport, op, metric, size): the minimum, median and
maximum over the runs of its main figure (latency: median_ns, bandwidth: gbps, rate: mops)
and of its ratio to the reference measured in the same run. Under the table: the machine's
1-minute load average (/proc/loadavg) before each run and the number of CPUs, so that a
figure taken on a loaded machine says so.

    scripts/spread.py --runs 5 target/release/rdma-tool \
        "bench data --async --transport tcp,local --iters 20000 --no-ucx"
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess

FIGURE = {"latency": "median_ns", "bandwidth": "gbps", "rate": "mops"}


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run(tool, command):
    out = subprocess.run([tool, *shlex.split(command), "--json"], capture_output=True,
                         text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            key = (r["transport"], r["op"], r["metric"], r["size"])
            rows[key] = (r[FIGURE.get(r["metric"], "median_ns")], r["ratio"])
    return rows


def spread(values):
    return f"{min(values):.4g} / {statistics.median(values):.4g} / {max(values):.4g}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("tool")
    p.add_argument("commands", nargs="+")
    args = p.parse_args()
    for command in args.commands:
        got, loads = {}, []
        for _ in range(args.runs):
            loads.append(load())
            for key, v in run(args.tool, command).items():
                got.setdefault(key, []).append(v)
        print(f"## {command} ({args.runs} runs)")
        print("| transport | op | metric | size | figure min / median / max | ratio min / median / max |")
        print("|---|---|---|---|---|---|")
        for key, vs in got.items():
            figures, ratios = [v[0] for v in vs], [v[1] for v in vs]
            print(f"| {' | '.join(map(str, key))} | {spread(figures)} | {spread(ratios)} |")
        print(f"\nload average (1 min) before each run: {', '.join(f'{x:.2f}' for x in loads)}"
              f" on {os.cpu_count()} CPUs\n", flush=True)


if __name__ == "__main__":
    main()
