"""Servers in processes of their own (`python -m rdmapool.server`): one is killed, and every
key is still read from its other replica. Also runs examples/python/kv_pages.py."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

import rdmapool

ROOT = pathlib.Path(__file__).resolve().parents[3]


def start_server(node):
    p = subprocess.Popen(
        [sys.executable, "-m", "rdmapool.server", "--node", str(node), "--size", "16M"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = p.stdout.readline()
    return p, json.loads(line)["addr"]


@pytest.fixture
def processes():
    started = [start_server(n) for n in (1, 2, 3)]
    yield started
    for p, _ in started:
        p.kill()
        p.wait()


def test_keys_survive_a_killed_server(processes):
    addrs = [a for _, a in processes]
    with rdmapool.Store(addrs) as store:
        keys = [f"k{i}".encode() for i in range(60)]
        store.put_many(keys, [k * 10 for k in keys])
        processes[1][0].kill()
        processes[1][0].wait()
        deadline = time.monotonic() + 30
        left = list(keys)
        while left:
            try:
                got = store.get_many(left)
            except rdmapool.BatchError as e:
                got = e.results
            for k, v in zip(list(left), got):
                if isinstance(v, rdmapool.NodeDown):
                    continue  # learnt the node is down: read again
                assert v == k * 10, k
                left.remove(k)
            assert time.monotonic() < deadline, f"still unread: {left}"


def test_server_module_refuses_bad_sizes():
    r = subprocess.run(
        [sys.executable, "-m", "rdmapool.server", "--size", "lots"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "want a size" in r.stderr


def test_the_kv_pages_example_passes():
    example = ROOT / "examples" / "python" / "kv_pages.py"
    r = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "128 pages read back" in r.stdout
