"""The store's calls, their results and their errors."""

from __future__ import annotations

import pytest

import rdmapool


def test_put_get_remove_exists(store):
    seq, writer = store.put(b"a", b"one")
    assert (seq, writer) == (1, store.client_id)
    assert store.get(b"a") == b"one"
    assert store.get("a") == b"one"  # a str key is its UTF-8 bytes
    assert store.exists(b"a") and not store.exists(b"b")
    assert store.put(b"a", bytearray(b"two"))[0] == 2
    assert store.get(b"a") == b"two"
    assert store.remove(b"a") is True
    assert store.get(b"a") is None
    assert store.remove(b"a") is False


def test_values_of_every_buffer_kind(store):
    import array

    store.put(b"mv", memoryview(b"xyz")[1:])
    assert store.get(b"mv") == b"yz"
    store.put(b"arr", array.array("I", [1, 2]))
    assert store.get(b"arr") == array.array("I", [1, 2]).tobytes()
    with pytest.raises(rdmapool.OutOfLimits):
        store.put(b"empty", b"")  # a value has at least one byte
    assert store.get(b"empty") is None


def test_a_second_client_reads_what_the_first_wrote(addrs, store):
    store.put(b"shared", b"x" * 10000)
    with rdmapool.Store(addrs) as other:
        assert other.get(b"shared") == b"x" * 10000


def test_list_get_many_put_many(store):
    keys = [f"user:{i}".encode() for i in range(20)]
    versions = store.put_many(keys, [k + b"!" for k in keys])
    assert [v[0] for v in versions] == [1] * 20
    assert store.list(b"user:1") == sorted(k for k in keys if k.startswith(b"user:1"))
    got = store.get_many(keys + [b"missing"])
    assert got == [k + b"!" for k in keys] + [None]
    assert set(store.list()) == set(keys)


def test_stats_count_hits_misses_and_copies(store):
    store.put(b"k", b"12345")
    store.get(b"k")
    store.get(b"nothing")
    s = store.stats()
    assert (s["puts"], s["hits"], s["misses"]) == (1, 1, 1)
    assert s["bytes_copied"] == 5  # the value of get; put of bytes reads them in place
    assert s["bytes_zero_copy"] == 0
    assert s["put_round_trips"] >= 1 and s["get_round_trips"] >= 1


def test_repair_reports_a_clean_cluster(store):
    store.put(b"k", b"v")
    r = store.repair()
    assert r["failed"] == 0 and r["unreadable"] == 0 and r["keys"] >= 1


def test_a_striped_value_comes_back_whole(addrs):
    with rdmapool.Store(addrs, part_size=64 << 10) as s:
        big = bytes(range(256)) * 1200  # 300 KiB: five parts
        s.put(b"big", big)
        assert s.get(b"big") == big


@pytest.mark.parametrize("key", [123, None, 1.5, ["k"]])
def test_a_key_that_is_not_bytes_or_str_is_refused(store, key):
    with pytest.raises(rdmapool.OutOfLimits):
        store.put(key, b"v")
    with pytest.raises(ValueError):
        store.get(key)


def test_keys_too_long_and_reserved_are_refused_and_nothing_is_lost(store):
    store.put(b"keep", b"me")
    with pytest.raises(rdmapool.OutOfLimits):
        store.put(b"k" * 70000, b"v")
    assert store.get(b"keep") == b"me"


def test_bad_settings_are_refused(addrs):
    with pytest.raises(rdmapool.OutOfLimits):
        rdmapool.Store(addrs, replicas=0)
    for grace in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(rdmapool.OutOfLimits):
            rdmapool.Store(addrs, grace=grace)
    with pytest.raises(rdmapool.OutOfLimits):
        rdmapool.Store(addrs, provider="nic")
    with pytest.raises(rdmapool.OutOfLimits):
        rdmapool.Store([])
    with pytest.raises(rdmapool.OutOfLimits):
        rdmapool.Store()
    with pytest.raises(rdmapool.OutOfLimits):
        rdmapool.Store(addrs, etcd="http://127.0.0.1:1")
    with pytest.raises(rdmapool.RdmapoolError):
        rdmapool.Store(["not an address"])
    with pytest.raises(OverflowError):
        rdmapool.Store(addrs, client_id=-1)


def test_no_reachable_server_raises_a_library_error():
    with pytest.raises(rdmapool.RdmapoolError):
        rdmapool.Store(["127.0.0.1:1"])


def test_more_replicas_than_servers_cannot_put(addrs):
    with rdmapool.Store(addrs, replicas=4) as s:
        with pytest.raises(rdmapool.RdmapoolError):
            s.put(b"k", b"v")


def test_a_closed_store_refuses_calls(addrs):
    s = rdmapool.Store(addrs)
    s.put(b"k", b"v")
    s.close()
    s.close()  # idempotent
    with pytest.raises(rdmapool.RdmapoolError, match="closed"):
        s.get(b"k")


def test_a_missing_key_file_is_a_typed_error(addrs, tmp_path):
    with pytest.raises(rdmapool.RdmapoolError):
        rdmapool.Store(addrs, key_file=str(tmp_path / "none"))


def test_devices_lists_the_soft_provider():
    soft = [d for d in rdmapool.devices() if d["provider"] == "soft"]
    assert soft and soft[0]["available"] and soft[0]["devices"]


def test_close_ends_the_client_so_its_id_can_join_again(addrs):
    s = rdmapool.Store(addrs, client_id=7)
    s.put(b"k", b"v")
    with pytest.raises(rdmapool.ClientIdInUse):
        rdmapool.Store(addrs, client_id=7)
    s.close()
    with rdmapool.Store(addrs, client_id=7) as again:
        assert again.get(b"k") == b"v"


def test_a_value_with_a_ttl_is_gone_after_it_and_the_older_value_does_not_come_back(store):
    import time

    store.put(b"t", b"older")
    store.put(b"t", b"expiring", ttl=0.3)
    store.put(b"stays", b"long", ttl=600)
    end = time.time() + 0.3
    while time.time() <= end:
        time.sleep(0.02)
    assert store.get(b"t") is None
    assert not store.exists(b"t")
    assert store.get(b"stays") == b"long"
    stats = store.stats()
    assert stats["expired"] >= 1 and stats["reclaimed"] >= 1, stats
    buf = store.register(bytearray(64))
    store.put_from(b"z", buf[:8], ttl=0.3)
    end = time.time() + 0.3
    while time.time() <= end:
        time.sleep(0.02)
    assert store.get_into(b"z", buf) is None


@pytest.mark.parametrize("ttl", [0, -1, 0.01, float("nan"), float("inf"), 1e300, "soon", [1]])
def test_bad_ttls_are_refused_and_nothing_is_lost(store, ttl):
    store.put(b"k", b"kept")
    with pytest.raises(rdmapool.OutOfLimits):
        store.put(b"k", b"new", ttl=ttl)
    assert store.get(b"k") == b"kept"


def test_remove_many_removes_each_key_once(store):
    store.put_many([b"r1", b"r2"], [b"a", b"b"])
    assert store.remove_many([b"r1", b"r2", b"never", b"r1"]) == [True, True, False, False]
    assert store.get(b"r1") is None and store.get(b"r2") is None
    with pytest.raises(rdmapool.BatchError) as e:
        store.remove_many([b"ok", b""])
    assert e.value.results[0] is False
    assert isinstance(e.value.results[1], rdmapool.OutOfLimits)


def test_a_cache_never_refuses_a_put_keeps_pins_and_answers_last_values_or_nothing(addrs):
    # 256 KiB per server, against about 5 MiB of blocks (4000 puts of 600 bytes, 1 KiB
    # blocks, 2 replicas over 3 servers): every put past the first few hundred evicts.
    with rdmapool.Store(addrs, cache_budget=256 << 10, grace=0.05) as cache:
        cache.put(b"hard", b"pinned", pin="hard")
        cache.put(b"soft", b"pinned softly", pin="soft")
        last = {}
        for i in range(4000):
            key = b"k%d" % (i % 1500)
            value = b"%d:" % i + bytes(600)
            cache.put(key, value)
            last[key] = value
        found = 0
        for key, value in last.items():
            got = cache.get(key)
            assert got is None or got == value, key
            found += got is not None
        assert 0 < found < len(last)
        assert cache.get(b"hard") == b"pinned"
        assert cache.get(b"soft") == b"pinned softly"
        stats = cache.stats()
        assert stats["evictions"] > 0 and stats["access_updates"] > 0, stats
        usage = cache.server_usage()
        assert len(usage) == 3 and all(u["budget"] == 256 << 10 for u in usage), usage
        assert all(0 < u["used"] <= 2 * (256 << 10) for u in usage), usage


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cache_budget": 0},
        {"cache_budget": 1 << 40},
        {"cache_budget": 1 << 20, "eviction": "fifo"},
        {"cache_budget": 1 << 20, "soft_pin": -1},
    ],
)
def test_bad_cache_settings_are_refused(addrs, kwargs):
    with pytest.raises(rdmapool.OutOfLimits):
        rdmapool.Store(addrs, **kwargs)


def test_bad_pins_are_refused_and_nothing_is_lost(addrs):
    with rdmapool.Store(addrs, cache_budget=64 << 10) as cache:
        cache.put(b"k", b"kept")
        with pytest.raises(rdmapool.OutOfLimits):
            cache.put(b"k", b"new", pin="forever")
        with pytest.raises(rdmapool.OutOfLimits):
            cache.put(b"k", bytes(40 << 10), pin="hard")  # more than half the budget
        assert cache.get(b"k") == b"kept"
