"""Fixtures: memory servers in this process (the soft provider; no NIC needed)."""

from __future__ import annotations

import pytest

import rdmapool


@pytest.fixture
def servers():
    """Three memory servers of 16 MiB, nodes 1 to 3."""
    started = [rdmapool.MemoryServer(16 << 20, node=n) for n in (1, 2, 3)]
    yield started
    for s in started:
        s.close()


@pytest.fixture
def addrs(servers):
    return [s.addr for s in servers]


@pytest.fixture
def store(addrs):
    s = rdmapool.Store(addrs)
    yield s
    s.close()
