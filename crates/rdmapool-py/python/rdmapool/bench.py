"""``python -m rdmapool.bench``: batches of KV pages through the Python zero-copy calls,
through the Rust API on the same store and memory, and through redis-py against a
redis-server, in one run.

For each page size (4 KiB and 64 KiB by default), a batch is 128 pages: ``batch_put_from``
then ``batch_get_into`` of 128 keys, against ``rdmapool._rdmapool.rust_batches`` (the same
``put_from`` futures run at once, or ``get_into_many``, looped in Rust) and redis-py's one
MSET / one MGET of the same 128 keys and bytes (one round trip each, as a pipeline would
take). The store's three memory servers run in this process (the soft provider's
intra-host path); redis-server listens on loopback.

Each figure is the median of ``--repeat`` alternating runs of ``--seconds`` each. Prints a
table, or with ``--json`` one object per row: ``op``, ``page``, ``metric`` (``rate``, in
pages per second), ``value``, ``reference``, ``reference_value``, ``ratio``, and for the
Python rows ``overhead_us_per_key`` (Python's time less Rust's, per key).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

from . import MemoryServer, Store
from ._rdmapool import rust_batches

KEYS = 128


def _timed(run_once: Callable[[], None], seconds: float) -> float:
    """Batches per second of `run_once`, run for about `seconds` (at least 3 times)."""
    n, t0 = 0, time.perf_counter()
    while True:
        run_once()
        n += 1
        elapsed = time.perf_counter() - t0
        if n >= 3 and elapsed >= seconds:
            return n / elapsed


def _rust_rate(store: Store, keys: list[bytes], buf: Any, page: int, put: bool, seconds: float) -> float:
    rounds = 3
    while True:
        took = rust_batches(store, keys, buf, page, rounds, put)
        if took >= seconds or rounds >= 1 << 20:
            return rounds / took
        rounds = max(rounds * 2, int(rounds * seconds / max(took, 1e-6)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Redis:
    """A redis-server on loopback for the run, and a redis-py client of it."""

    def __init__(self) -> None:
        import redis  # the reference's client: pip install redis

        self.port = _free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        self.client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def run(
    pages: list[int], seconds: float, repeat: int, with_redis: bool, server_size: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    servers = [MemoryServer(server_size, node=n, chunk_size=4 << 20) for n in (1, 2, 3)]
    redis = _Redis() if with_redis else None
    try:
        store = Store([s.addr for s in servers], grace=0.1)
        for page in pages:
            keys = [f"bench:{page}:{i}".encode() for i in range(KEYS)]
            data = np.random.default_rng(page).integers(0, 256, size=(KEYS, page), dtype=np.uint8)
            src = store.register(data)
            out = np.zeros_like(data)
            dst = store.register(out)
            src_views = [src.view(i * page, page) for i in range(KEYS)]
            dst_views = [dst.view(i * page, page) for i in range(KEYS)]
            store.batch_put_from(keys, src_views)
            values = [data[i].tobytes() for i in range(KEYS)]
            mapping = dict(zip(keys, values))
            measured: dict[str, list[float]] = {}
            for _ in range(repeat):
                for name, fn in (
                    ("py put", lambda: store.batch_put_from(keys, src_views)),
                    ("rust put", lambda: _rust_rate(store, keys, src, page, True, seconds)),
                    ("py get", lambda: store.batch_get_into(keys, dst_views)),
                    ("rust get", lambda: _rust_rate(store, keys, dst, page, False, seconds)),
                ):
                    rate = fn() if name.startswith("rust") else _timed(fn, seconds)
                    measured.setdefault(name, []).append(rate * KEYS)
                if redis is not None:
                    measured.setdefault("redis put", []).append(
                        KEYS * _timed(lambda: redis.client.mset(mapping), seconds)
                    )
                    measured.setdefault("redis get", []).append(
                        KEYS * _timed(lambda: redis.client.mget(keys), seconds)
                    )
            assert np.array_equal(out, data), "every page read back"
            med = {k: statistics.median(v) for k, v in measured.items()}
            for op in ("put", "get"):
                py, rust = med[f"py {op}"], med[f"rust {op}"]
                call = "batch_put_from" if op == "put" else "batch_get_into"
                rows.append({
                    "op": call, "page": page, "metric": "rate", "value": py,
                    "reference": "rust", "reference_value": rust, "ratio": py / rust,
                    "overhead_us_per_key": (1 / py - 1 / rust) * 1e6,
                })
                if redis is not None:
                    ref = med[f"redis {op}"]
                    rows.append({
                        "op": call, "page": page, "metric": "rate", "value": py,
                        "reference": "redis-py " + ("MSET" if op == "put" else "MGET"),
                        "reference_value": ref, "ratio": py / ref,
                    })
        stats = store.stats()
        rows.append({"op": "bytes_copied", "page": 0, "metric": "count",
                     "value": stats["bytes_copied"], "reference": None,
                     "reference_value": None, "ratio": None})
        store.close()
    finally:
        if redis is not None:
            redis.close()
        for s in servers:
            s.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rdmapool.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", default="4096,65536", help="page sizes in bytes (4096,65536)")
    p.add_argument("--seconds", type=float, default=1.0, help="per measured run (1.0)")
    p.add_argument("--repeat", type=int, default=3, help="alternating runs per figure (3)")
    p.add_argument("--no-redis", action="store_true", help="leave out redis-py")
    p.add_argument(
        "--server-size",
        type=int,
        default=1 << 30,
        help="bytes per memory server (1 GiB: room for the blocks puts replace during the "
        "0.1 s grace period at 64 KiB; the soft provider pins them, so this needs a "
        "memlock limit of 3 GiB or more)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    a = p.parse_args(argv)
    pages = [int(x) for x in a.pages.split(",")]
    with_redis = not a.no_redis
    if with_redis and shutil.which("redis-server") is None:
        print("redis-server not found: leaving redis-py out (--no-redis)", file=sys.stderr)
        with_redis = False
    rows = run(pages, a.seconds, max(1, a.repeat), with_redis, a.server_size)
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"{'call':<16}{'page':>7}  {'pages/s':>11}  {'reference':<16}{'ref pages/s':>12}  {'ratio':>6}  {'µs/key over Rust':>16}")
    for r in rows:
        if r["metric"] != "rate":
            print(f"bytes copied by Python on the zero-copy calls: {r['value']}")
            continue
        over = r.get("overhead_us_per_key")
        print(f"{r['op']:<16}{r['page']:>7}  {r['value']:>11.0f}  {r['reference']:<16}{r['reference_value']:>12.0f}  "
              f"{r['ratio']:>6.2f}  {'' if over is None else f'{over:16.2f}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
