"""Per-server counters (docs/STORE.md section 2): hits, misses, evictions and expirations
that every client adds to the servers' index chunks, read by ``Store.server_stats()``."""

from __future__ import annotations

import time

import rdmapool

FIELDS = {"node", "used", "budget", "hits", "misses", "evictions", "expirations"}


def test_server_stats_add_up_every_clients_gets_once_they_flushed(addrs):
    with rdmapool.Store(addrs) as writer:
        for i in range(10):
            writer.put(b"k%d" % i, b"v")
        writer.put(b"brief", b"soon gone", ttl=0.2)
    time.sleep(0.3)
    reader = rdmapool.Store(addrs)
    for i in range(10):
        assert reader.get(b"k%d" % i) == b"v"
    for i in range(5):
        assert reader.get(b"missing%d" % i) is None
    assert reader.get(b"brief") is None  # expired: an expiration and a miss
    own = reader.stats()
    reader.close()  # adds what it counted
    with rdmapool.Store(addrs) as other:
        stats = other.server_stats()
    assert sorted(s["node"] for s in stats) == [1, 2, 3]
    assert all(set(s) == FIELDS for s in stats), stats
    total = {k: sum(s[k] for s in stats) for k in ("hits", "misses", "evictions", "expirations")}
    assert total == {"hits": 10, "misses": 6, "evictions": 0, "expirations": 1}, stats
    assert (own["hits"], own["misses"], own["expired"]) == (10, 6, 1)
    assert all(s["used"] == 0 and s["budget"] == 0 for s in stats), stats


def test_a_caches_evictions_count_on_the_servers_after_flush_counters(addrs):
    with rdmapool.Store(addrs, cache_budget=256 << 10) as cache:
        for i in range(1500):
            cache.put(b"c%d" % i, bytes(600))
        found = sum(cache.get(b"c%d" % i) is not None for i in range(0, 1500, 15))
        cache.flush_counters()
        stats = cache.server_stats()
        own = cache.stats()
    assert own["evictions"] > 0, own
    assert sum(s["evictions"] for s in stats) == own["evictions"], (stats, own)
    assert sum(s["hits"] for s in stats) == found == own["hits"], stats
    assert sum(s["misses"] for s in stats) == 100 - found == own["misses"], stats
    assert all(s["budget"] == 256 << 10 and s["used"] > 0 for s in stats), stats
