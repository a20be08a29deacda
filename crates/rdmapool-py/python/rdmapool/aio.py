"""asyncio front ends: ``AsyncStore`` and ``AsyncPoolClient`` await the same calls as
``Store`` and ``PoolClient`` without blocking the running loop.

Each call runs on a worker thread of the client's own executor and releases the GIL there
while the RDMA operations are under way, so the loop keeps serving other tasks; several
calls of one client run at once (up to ``workers``).

>>> import asyncio, rdmapool, rdmapool.aio
>>> async def main(addrs):
...     store = rdmapool.aio.AsyncStore(addrs)
...     await store.put(b"k", b"v")
...     got = await store.get(b"k")
...     await store.close()
...     return got
>>> with rdmapool.MemoryServer(4 << 20, node=1) as a, rdmapool.MemoryServer(4 << 20, node=2) as b:
...     asyncio.run(main([a.addr, b.addr]))
b'v'
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

from ._rdmapool import PoolClient, RegisteredBuffer, RemotePtr, Store

__all__ = ["AsyncStore", "AsyncPoolClient"]

T = TypeVar("T")


class _OnThreads:
    """Runs a blocking client's calls on an executor of its own."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers: {workers} (want at least 1)")
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rdmapool")

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=True)


class AsyncStore(_OnThreads):
    """``Store`` with awaitable calls. Takes ``Store``'s arguments, and ``workers``: how many
    calls of this client may run at once (default 4)."""

    def __init__(self, *args: Any, workers: int = 4, **kwargs: Any) -> None:
        super().__init__(workers)
        self.store = Store(*args, **kwargs)

    def register(self, buffer: Any) -> RegisteredBuffer:
        """``Store.register`` (registration is quick; it runs inline)."""
        return self.store.register(buffer)

    async def put(
        self,
        key: bytes | str,
        value: Any,
        ttl: float | None = None,
        pin: str | None = None,
    ) -> tuple[int, int]:
        """``Store.put``, awaited."""
        return await self._run(self.store.put, key, value, ttl, pin)

    async def get(self, key: bytes | str) -> bytes | None:
        """``Store.get``, awaited."""
        return await self._run(self.store.get, key)

    async def remove(self, key: bytes | str) -> bool:
        """``Store.remove``, awaited."""
        return await self._run(self.store.remove, key)

    async def exists(self, key: bytes | str) -> bool:
        """``Store.exists``, awaited."""
        return await self._run(self.store.exists, key)

    async def list(self, prefix: bytes | str | None = None) -> list[bytes]:
        """``Store.list``, awaited."""
        return await self._run(self.store.list, prefix)

    async def put_from(
        self,
        key: bytes | str,
        view: RegisteredBuffer,
        ttl: float | None = None,
        pin: str | None = None,
    ) -> tuple[int, int]:
        """``Store.put_from``, awaited."""
        return await self._run(self.store.put_from, key, view, ttl, pin)

    async def get_into(self, key: bytes | str, view: RegisteredBuffer) -> int | None:
        """``Store.get_into``, awaited."""
        return await self._run(self.store.get_into, key, view)

    async def batch_put_from(
        self, keys: Sequence[bytes | str], views: Sequence[RegisteredBuffer]
    ) -> list[tuple[int, int]]:
        """``Store.batch_put_from``, awaited."""
        return await self._run(self.store.batch_put_from, keys, views)

    async def batch_get_into(
        self, keys: Sequence[bytes | str], views: Sequence[RegisteredBuffer]
    ) -> list[int | None]:
        """``Store.batch_get_into``, awaited."""
        return await self._run(self.store.batch_get_into, keys, views)

    async def batch_exists(self, keys: Sequence[bytes | str]) -> list[bool]:
        """``Store.batch_exists``, awaited."""
        return await self._run(self.store.batch_exists, keys)

    async def get_many(self, keys: Sequence[bytes | str]) -> list[bytes | None]:
        """``Store.get_many``, awaited."""
        return await self._run(self.store.get_many, keys)

    async def put_many(self, keys: Sequence[bytes | str], values: Sequence[Any]) -> list[tuple[int, int]]:
        """``Store.put_many``, awaited."""
        return await self._run(self.store.put_many, keys, values)

    async def remove_many(self, keys: Sequence[bytes | str]) -> list[bool]:
        """``Store.remove_many``, awaited."""
        return await self._run(self.store.remove_many, keys)

    async def repair(self) -> dict[str, int]:
        """``Store.repair``, awaited."""
        return await self._run(self.store.repair)

    def stats(self) -> dict[str, int]:
        """``Store.stats`` (counters only: it does not block)."""
        return self.store.stats()

    async def close(self) -> None:
        """Closes the store (``Store.close``), then the executor."""
        await self._run(self.store.close)
        self._shutdown()

    async def __aenter__(self) -> "AsyncStore":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncPoolClient(_OnThreads):
    """``PoolClient`` with awaitable calls. Takes ``PoolClient``'s arguments, and ``workers``."""

    def __init__(self, *args: Any, workers: int = 4, **kwargs: Any) -> None:
        super().__init__(workers)
        self.client = PoolClient(*args, **kwargs)

    def register(self, buffer: Any) -> RegisteredBuffer:
        """``PoolClient.register`` (quick; it runs inline)."""
        return self.client.register(buffer)

    async def alloc(self, size: int) -> RemotePtr:
        """``PoolClient.alloc``, awaited."""
        return await self._run(self.client.alloc, size)

    async def free(self, ptr: RemotePtr) -> None:
        """``PoolClient.free``, awaited."""
        return await self._run(self.client.free, ptr)

    async def write(self, ptr: RemotePtr, data: Any, offset: int = 0) -> None:
        """``PoolClient.write``, awaited."""
        return await self._run(self.client.write, ptr, data, offset)

    async def read(self, ptr: RemotePtr, offset: int = 0, length: int | None = None) -> bytes:
        """``PoolClient.read``, awaited."""
        return await self._run(self.client.read, ptr, offset, length)

    async def write_from(self, ptr: RemotePtr, view: RegisteredBuffer, offset: int = 0) -> None:
        """``PoolClient.write_from``, awaited."""
        return await self._run(self.client.write_from, ptr, view, offset)

    async def read_into(self, ptr: RemotePtr, view: RegisteredBuffer, offset: int = 0) -> None:
        """``PoolClient.read_into``, awaited."""
        return await self._run(self.client.read_into, ptr, view, offset)

    async def cas(self, ptr: RemotePtr, offset: int, expected: int, new: int) -> int:
        """``PoolClient.cas``, awaited."""
        return await self._run(self.client.cas, ptr, offset, expected, new)

    async def faa(self, ptr: RemotePtr, offset: int, add: int) -> int:
        """``PoolClient.faa``, awaited."""
        return await self._run(self.client.faa, ptr, offset, add)

    async def batch(self, ops: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``PoolClient.batch``, awaited."""
        return await self._run(self.client.batch, ops)

    async def close(self) -> None:
        """Closes the client (``PoolClient.close``), then the executor."""
        await self._run(self.client.close)
        self._shutdown()
