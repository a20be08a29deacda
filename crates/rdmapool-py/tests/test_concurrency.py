"""The GIL is released during calls; threads share a client; asyncio is never blocked."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

import rdmapool
import rdmapool.aio

PAGE = 64 << 10


def _pages(store, n):
    data = np.random.default_rng(1).integers(0, 256, size=(n, PAGE), dtype=np.uint8)
    buf = store.register(data)
    keys = [f"big:{i}" for i in range(n)]
    store.batch_put_from(keys, [buf.view(i * PAGE, PAGE) for i in range(n)])
    return data, keys


def test_a_python_thread_runs_during_a_batch_get(store):
    data, keys = _pages(store, 64)
    out = np.zeros_like(data)
    dst = store.register(out)
    views = [dst.view(i * PAGE, PAGE) for i in range(len(keys))]
    ticks = 0
    running = threading.Event()
    done = threading.Event()

    def tick():
        nonlocal ticks
        running.set()
        while not done.is_set():
            ticks += 1

    t = threading.Thread(target=tick)
    t.start()
    running.wait()
    # Holding the GIL, this thread reads `ticks`, makes the call, reads it again: without
    # the GIL released inside the call, the ticker cannot run in between.
    advanced = []
    for _ in range(5):
        before = ticks
        store.batch_get_into(keys, views)
        advanced.append(ticks - before)
    done.set()
    t.join()
    assert np.array_equal(out, data)
    assert max(advanced) > 0, f"the ticker never ran during a call: {advanced}"


def test_threads_share_one_store(store):
    errors = []

    def work(n):
        try:
            for i in range(50):
                key = f"t{n}:{i}".encode()
                store.put(key, key * 3)
                assert store.get(key) == key * 3
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.stats()["puts"] == 200


def test_asyncio_calls_do_not_block_the_loop(addrs):
    async def main():
        store = rdmapool.aio.AsyncStore(addrs)
        data, keys = _pages(store.store, 64)
        out = np.zeros_like(data)
        dst = store.register(out)
        views = [dst.view(i * PAGE, PAGE) for i in range(len(keys))]
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        got = await asyncio.gather(*(store.batch_get_into(keys, views) for _ in range(4)))
        stop.set()
        await t
        assert all(g == [PAGE] * len(keys) for g in got)
        assert np.array_equal(out, data)
        assert ticks > before, "the loop ran other tasks while the batches ran"
        await store.put(b"a", b"1")
        assert await store.get(b"a") == b"1"
        assert await store.batch_exists([b"a", b"b"]) == [True, False]
        assert await store.remove(b"a")
        await store.close()

    asyncio.run(main())


def test_async_pool_client(addrs):
    async def main():
        pool = rdmapool.aio.AsyncPoolClient(addrs)
        ptr = await pool.alloc(16)
        await pool.write(ptr, bytes(16))
        assert await asyncio.gather(*(pool.faa(ptr, 0, 1) for _ in range(10))) is not None
        assert int.from_bytes(await pool.read(ptr, 0, 8), "little") == 10
        await pool.free(ptr)
        await pool.close()

    asyncio.run(main())
