"""KV-cache pages on rdmapool, the way an LLM serving stack keeps them.

A serving engine computes attention key/value tensors page by page (here 16 tokens per
page). A page is named by the hash of the token prefix it ends, so any request that shares
the prefix can fetch the page instead of computing it again. This example:

1. starts three memory servers, each in a process of its own (``python -m rdmapool.server``);
2. registers the host KV tensor once, and stores 128 pages with one ``batch_put_from``
   (no copy: the NIC reads the tensor's memory), two replicas each;
3. asks ``batch_exists`` which prefixes are cached, as a scheduler does before prefill;
4. kills one server, then fetches every page with ``batch_get_into`` into a fresh tensor,
   and checks each byte.

Run it from the repository's root after ``pip install ./crates/rdmapool-py numpy``::

    python examples/python/kv_pages.py
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

import numpy as np

import rdmapool

PAGES = 128
TOKENS_PER_PAGE = 16
# One page: K and V of 16 tokens = 4 KiB of float16. Small, so that the example runs
# within an ordinary account's 8 MiB locked-memory limit (each server pins 6 MiB; this
# process pins about 6 MiB for the client and 1 MiB for the two page arrays).
LAYERS, HEADS, HEAD_DIM = 2, 2, 16


def page_keys(tokens: list[int]) -> list[bytes]:
    """One key per page: the hash of every token up to the page's end (a prefix hash)."""
    keys, h = [], hashlib.sha256()
    for p in range(len(tokens) // TOKENS_PER_PAGE):
        chunk = tokens[p * TOKENS_PER_PAGE : (p + 1) * TOKENS_PER_PAGE]
        h.update(np.asarray(chunk, dtype=np.int32).tobytes())
        keys.append(b"kv:" + h.copy().hexdigest().encode())
    return keys


def start_server(node: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdmapool.server", "--node", str(node), "--size", "6M"],
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, json.loads(proc.stdout.readline())["addr"]


def main() -> int:
    servers = [start_server(n) for n in (1, 2, 3)]
    try:
        store = rdmapool.Store([addr for _, addr in servers], replicas=2)
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, 32000, size=PAGES * TOKENS_PER_PAGE).tolist()
        keys = page_keys(tokens)
        # The host KV tensor: one row per page, K and V of every layer and head.
        kv = rng.standard_normal((PAGES, 2, LAYERS, TOKENS_PER_PAGE, HEADS, HEAD_DIM)).astype(np.float16)
        page_bytes = kv[0].nbytes
        src = store.register(kv)  # once; views of it are pages
        pages = [src.view(i * page_bytes, page_bytes) for i in range(PAGES)]
        store.batch_put_from(keys, pages)

        # The scheduler's question: which prefixes are cached? (plus one that is not)
        unknown = page_keys(list(reversed(tokens)))[:1]
        cached = store.batch_exists(keys + unknown)
        assert cached == [True] * PAGES + [False], "every stored page is cached, the unknown is not"

        # Lose a server: every page has a replica on another.
        victim, _ = servers[1]
        victim.kill()
        victim.wait()

        fresh = np.zeros_like(kv)
        dst = store.register(fresh)
        views = [dst.view(i * page_bytes, page_bytes) for i in range(PAGES)]
        todo = list(range(PAGES))
        deadline = time.monotonic() + 30
        while todo:
            try:
                got = store.batch_get_into([keys[i] for i in todo], [views[i] for i in todo])
            except rdmapool.BatchError as e:
                got = e.results  # the first calls that meet the dead server learn it is down
            todo = [i for i, n in zip(todo, got) if n != page_bytes]
            if todo and time.monotonic() > deadline:
                raise SystemExit(f"{len(todo)} pages unread after a server was lost")
        assert np.array_equal(fresh, kv), "every byte of every page came back"
        stats = store.stats()
        assert stats["bytes_copied"] == 0, "the page calls copied nothing in Python"
        print(
            f"{PAGES} pages read back after node 2 was killed "
            f"({page_bytes} B each, {stats['bytes_zero_copy']} bytes moved zero-copy, "
            f"{stats['puts']} puts, {stats['hits']} hits)"
        )
        store.close()
        return 0
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
