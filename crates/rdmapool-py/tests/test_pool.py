"""The pool client: allocation, one-sided reads, writes and atomics, batches."""

from __future__ import annotations

import pytest

import rdmapool


@pytest.fixture
def pool(addrs):
    return rdmapool.PoolClient(addrs)


def test_alloc_write_read_free(pool):
    ptr = pool.alloc(100)
    assert ptr.len >= 100
    pool.write(ptr, b"hello", offset=10)
    assert pool.read(ptr, 10, 5) == b"hello"
    assert len(pool.read(ptr)) == ptr.len
    pool.free(ptr)
    with pytest.raises(rdmapool.StalePointer):
        pool.free(ptr)


def test_atomics(pool):
    ptr = pool.alloc(16)
    pool.write(ptr, bytes(16))
    assert pool.faa(ptr, 0, 5) == 0
    assert pool.faa(ptr, 0, 1) == 5
    assert pool.cas(ptr, 0, 6, 100) == 6  # swapped
    assert pool.cas(ptr, 0, 6, 200) == 100  # not swapped
    assert int.from_bytes(pool.read(ptr, 0, 8), "little") == 100
    with pytest.raises(rdmapool.RdmapoolError):
        pool.faa(ptr, 3, 1)  # misaligned


def test_zero_copy_and_batches(pool):
    ptr = pool.alloc(64)
    src = pool.register(bytearray(b"A" * 32 + b"B" * 32))
    pool.write_from(ptr, src)
    dst_mem = bytearray(64)
    dst = pool.register(dst_mem)
    pool.read_into(ptr, dst)
    assert bytes(dst_mem) == b"A" * 32 + b"B" * 32
    counter = pool.alloc(8)
    pool.write(counter, bytes(8))
    out = pool.batch(
        [
            ("faa", counter, 0, 2),
            ("cas", counter, 0, 2, 9),
            ("write", ptr, src[32:64], 0),
            ("read", ptr, dst[0:32]),
        ]
    )
    assert out == [0, 2, None, None]
    assert bytes(dst_mem[:32]) == b"B" * 32
    with pytest.raises(rdmapool.OutOfLimits):
        pool.batch([("swap", ptr, 0, 1)])
    # A misaligned atomic is refused before anything is posted (it would fail its list).
    with pytest.raises(rdmapool.OutOfLimits, match="aligned"):
        pool.batch([("faa", counter, 0, 1), ("faa", counter, 4, 1)])
    assert int.from_bytes(pool.read(counter, 0, 8), "little") == 9


def test_out_of_bounds_is_refused_before_anything_is_posted(pool):
    ptr = pool.alloc(32)
    with pytest.raises(rdmapool.OutOfLimits):
        pool.write(ptr, b"x" * 64)
    with pytest.raises(rdmapool.OutOfLimits):
        pool.read(ptr, 40, 8)
    with pytest.raises(rdmapool.OutOfLimits):
        pool.alloc(0)


def test_pointers_parse_and_print(pool):
    ptr = pool.alloc(8)
    same = rdmapool.RemotePtr.parse(str(ptr))
    assert same == ptr and hash(same) == hash(ptr)
    assert (same.node, same.offset, same.len, same.incarnation) == (
        ptr.node,
        ptr.offset,
        ptr.len,
        ptr.incarnation,
    )
    with pytest.raises(rdmapool.RdmapoolError):
        rdmapool.RemotePtr.parse("3:1")


def test_the_servers_cpu_takes_no_part(servers, pool):
    ptr = pool.alloc(8)
    pool.write(ptr, b"12345678")
    pool.read(ptr)
    assert sum(s.stats()["requests_handled"] for s in servers) == 0


def test_a_closed_server_refuses_stats_and_closes_once(servers):
    s = servers[0]
    s.close()
    assert s.close() == 0
    with pytest.raises(rdmapool.RdmapoolError):
        s.stats()


def test_bad_server_settings(tmp_path):
    with pytest.raises(rdmapool.OutOfLimits):
        rdmapool.MemoryServer(1 << 20, listen="nowhere")
    with pytest.raises(rdmapool.OutOfLimits):
        rdmapool.MemoryServer(1 << 20, lease=0)
    with pytest.raises(rdmapool.RdmapoolError):
        rdmapool.MemoryServer(0)


def test_close_ends_the_pool_client(addrs):
    with rdmapool.PoolClient(addrs, client_id=11) as pool:
        ptr = pool.alloc(8)
        with pytest.raises(rdmapool.ClientIdInUse):
            rdmapool.PoolClient(addrs, client_id=11)
    with pytest.raises(rdmapool.RdmapoolError, match="closed"):
        pool.read(ptr)
    again = rdmapool.PoolClient(addrs, client_id=11)
    assert again.client_id == 11
    again.close()
    again.close()  # idempotent
