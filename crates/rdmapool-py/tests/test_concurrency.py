"""The GIL is released during calls; threads share a client; asyncio is never blocked."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

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
            time.sleep(0)  # gives the GIL back at once

    # No forced switches: a thread gives the GIL up only where it releases it itself (a
    # wait, a sleep, an rdmapool call). So the ticker can tick during the call only if the
    # call releases the GIL; this thread releases it nowhere else between its two reads of
    # `ticks`. A short call may still end before the ticker is woken: up to 1000 calls.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1000)
    try:
        t = threading.Thread(target=tick)
        t.start()
        running.wait()
        calls = 0
        advanced = 0
        while advanced == 0 and calls < 1000:
            before = ticks
            store.batch_get_into(keys, views)
            advanced = ticks - before
            calls += 1
        done.set()
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert np.array_equal(out, data)
    assert advanced > 0, f"the ticker never ran during any of {calls} calls"


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
        got = await asyncio.gather(*(store.batch_get_into(keys, views) for _ in range(4)))
        assert all(g == [PAGE] * len(keys) for g in got)
        assert np.array_equal(out, data)
        # The loop runs other tasks while a call is under way: a ticker task counts the
        # turns it gets while a call is inside the store. A call run on the loop's own
        # thread would set and clear `inside` before any other task ran.
        inside = threading.Event()

        def call():
            inside.set()
            try:
                return store.store.batch_get_into(keys, views)
            finally:
                inside.clear()

        seen = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal seen
            while not stop.is_set():
                seen += inside.is_set()
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        calls = 0
        while seen == 0 and calls < 1000:
            await store._run(call)
            calls += 1
        stop.set()
        await t
        assert seen > 0, f"no other task ran during any of {calls} calls"
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
