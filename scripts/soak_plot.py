"""Plots a soak CSV (crates/rdmapool/examples/soak.rs) and judges growth.

usage: soak_plot.py SOAK.csv STRESS.jsonl OUT.png

Verdict per resource: the mean of the last quarter of samples against the first quarter's,
and the least-squares slope per minute over the whole run and over its second half. A
resource grows when its last quarter exceeds the first by more than its tolerance.
"""
import csv
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# column -> (label, scale, tolerance as (relative, absolute) in the column's own unit)
RESOURCES = {
    "rss_kb": ("RSS (MiB)", 1 / 1024, (0.10, 2048)),
    "pinned_bytes": ("pinned (MiB)", 1 / 2**20, (0.0, 0)),
    "fds": ("open fds", 1, (0.0, 8)),
    "threads": ("threads", 1, (0.0, 4)),
    "qps": ("live QPs", 1, (0.0, 6)),
    "regions": ("live regions", 1, (0.0, 2)),
}


def main():
    soak, stress, png = sys.argv[1:4]
    rows = list(csv.DictReader(open(soak)))
    if len(rows) < 8:
        sys.exit(f"only {len(rows)} samples in {soak}: too few to judge")
    col = {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}
    t = col["t_s"] / 60.0
    q = max(1, len(rows) // 4)
    half = len(rows) // 2

    runs = [json.loads(line) for line in open(stress) if line.strip()]
    stress_failed = sum(1 for r in runs if r.get("failed_run") or r.get("failures", 0) > 0)
    stress_rounds = sum(r.get("count", 0) for r in runs)

    fig, axes = plt.subplots(3, 2, figsize=(12, 10), sharex=True)
    panels = [
        ("RSS (MiB)", [("rss_kb", 1 / 1024)]),
        ("pinned (MiB)", [("pinned_bytes", 1 / 2**20)]),
        ("open fds", [("fds", 1)]),
        ("threads, live QPs, live regions", [("threads", 1), ("qps", 1), ("regions", 1)]),
        ("latency (us, log)", [("p50_us", 1), ("p99_us", 1)]),
        ("operations per interval", [("ops", 1)]),
    ]
    for ax, (title, series) in zip(axes.flat, panels):
        for name, scale in series:
            ax.plot(t, col[name] * scale, label=name)
        ax.set_title(title)
        if title.startswith("latency"):
            ax.set_yscale("log")
        if len(series) > 1:
            ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("minutes")
    minutes = t[-1]
    fig.suptitle(
        f"rdmapool soak: {minutes:.1f} min, {int(col['ops'].sum())} operations, "
        f"{int(col['errors'].sum())} errors; rdma-tool stress beside it: "
        f"{len(runs)} runs, {stress_failed} failed"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=80)

    print(f"duration {minutes:.1f} min, {len(rows)} samples, "
          f"{int(col['ops'].sum())} operations, {int(col['errors'].sum())} errors, "
          f"{col['mb'].sum():.0f} MB verified")
    print(f"rdma-tool stress: {len(runs)} runs, {stress_rounds} rounds, {stress_failed} failed")
    print(f"latency p50 us: first quarter {col['p50_us'][:q].mean():.1f}, "
          f"last quarter {col['p50_us'][-q:].mean():.1f}; p99 us: first quarter "
          f"{col['p99_us'][:q].mean():.1f}, last quarter {col['p99_us'][-q:].mean():.1f}")
    print(f"{'resource':14} {'first q':>12} {'last q':>12} {'slope/min':>11} "
          f"{'2nd half/min':>12}  verdict")
    grew = []
    for name, (label, scale, (rel, tol)) in RESOURCES.items():
        y = col[name]
        first, last = y[:q].mean(), y[-q:].mean()
        slope = np.polyfit(t, y, 1)[0]
        slope2 = np.polyfit(t[half:], y[half:], 1)[0] if len(rows) - half >= 2 else 0.0
        ok = last <= first * (1 + rel) + tol
        if not ok:
            grew.append(name)
        print(f"{name:14} {first * scale:12.1f} {last * scale:12.1f} {slope * scale:11.3f} "
              f"{slope2 * scale:12.3f}  {'flat' if ok else 'GROWS'}")
    failed = int(col["errors"].sum()) > 0 or stress_failed > 0
    if grew or failed:
        print(f"verdict: NOT OK (grows: {', '.join(grew) or 'none'}; errors: {failed})")
        sys.exit(1)
    print("verdict: no growth, no errors")


if __name__ == "__main__":
    main()
