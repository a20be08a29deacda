"""Type stubs of the native module ``rdmapool._rdmapool`` (re-exported by ``rdmapool``)."""

from __future__ import annotations

from collections.abc import Buffer, Iterable, Sequence
from typing import Any, Literal

__version__: str

def devices() -> list[dict[str, Any]]:
    """The RDMA providers built in (``soft``, ``verbs``): ``provider``, ``available``,
    ``unavailable`` (why not, or None) and ``devices`` (names)."""

def rust_batches(
    store: Store, keys: list[bytes], buffer: RegisteredBuffer, page: int, rounds: int, put: bool
) -> float:
    """For ``python -m rdmapool.bench``: ``rounds`` batches of ``put_from`` (or ``get_into``)
    of every key at once, page ``i`` at ``i * page`` of ``buffer``, looped in Rust; the
    seconds they took."""

Key = bytes | str
"""A key: bytes, or a str (its UTF-8 bytes)."""

Version = tuple[int, int]
"""A stored value's version: ``(seq, writer)``, seq counting from 1, writer a client id."""

class RegisteredBuffer:
    """Memory of a Python object (any C-contiguous buffer: bytearray, memoryview, a NumPy
    array; or a CPU DLPack producer such as a torch tensor) registered with one client, or a slice of such a registration. Holds the
    object's buffer export while any view of it lives: the object stays alive, and a
    bytearray cannot be resized meanwhile. Its bytes must not change while a call that
    reads them runs, nor be read while a call that writes them runs."""

    @property
    def nbytes(self) -> int: ...
    @property
    def offset(self) -> int:
        """Where this view starts in the registered object, in bytes."""
    @property
    def readonly(self) -> bool:
        """True for an object exported read-only (bytes): usable for puts only."""
    def __len__(self) -> int: ...
    def view(self, offset: int, length: int) -> RegisteredBuffer:
        """A view of ``length`` bytes at ``offset`` of this one (same registration)."""
    def __getitem__(self, index: slice) -> RegisteredBuffer:
        """``buf[a:b]``: a view of those bytes (step 1)."""
    def tobytes(self) -> bytes:
        """A copy of the view's bytes (for checks; the data path never copies)."""

class Store:
    """A client of the replicated store: every value on ``replicas`` distinct servers; get,
    put and remove are one-sided RDMA on the servers' memory. Every call releases the GIL
    while it runs. Usable as a context manager (``close`` on exit)."""

    def __init__(
        self,
        servers: Sequence[str] | str | None = None,
        *,
        etcd: Sequence[str] | str | None = None,
        etcd_prefix: str = "/rdmapool/pool",
        replicas: int = 2,
        client_id: int | None = None,
        key_file: str | None = None,
        client_key_file: str | None = None,
        grace: float = 1.0,
        part_size: int = 262144,
        provider: Literal["soft", "verbs"] = "soft",
        device: str | None = None,
        cache_budget: int | None = None,
        eviction: Literal["lru", "lfu"] = "lru",
        soft_pin: float = 1800.0,
    ) -> None: ...
    @property
    def client_id(self) -> int: ...
    def put(
        self,
        key: Key,
        value: Buffer,
        ttl: float | None = None,
        pin: Literal["hard", "soft"] | None = None,
    ) -> Version: ...
    def get(self, key: Key) -> bytes | None: ...
    def remove(self, key: Key) -> bool: ...
    def exists(self, key: Key) -> bool: ...
    def list(self, prefix: Key | None = None) -> list[bytes]: ...
    def register(self, buffer: Buffer | Any) -> RegisteredBuffer: ...
    def put_from(
        self,
        key: Key,
        view: RegisteredBuffer,
        ttl: float | None = None,
        pin: Literal["hard", "soft"] | None = None,
    ) -> Version: ...
    def get_into(self, key: Key, view: RegisteredBuffer) -> int | None: ...
    def batch_put_from(self, keys: Iterable[Key], views: Sequence[RegisteredBuffer]) -> list[Version]: ...
    def batch_get_into(self, keys: Iterable[Key], views: Sequence[RegisteredBuffer]) -> list[int | None]: ...
    def batch_exists(self, keys: Iterable[Key]) -> list[bool]: ...
    def get_many(self, keys: Iterable[Key]) -> list[bytes | None]: ...
    def put_many(self, keys: Iterable[Key], values: Iterable[Buffer]) -> list[Version]: ...
    def remove_many(self, keys: Iterable[Key]) -> list[bool]: ...
    def repair(self) -> dict[str, int]: ...
    def server_usage(self) -> list[dict[str, int]]: ...
    def server_stats(self) -> list[dict[str, int]]: ...
    def flush_counters(self) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Store: ...
    def __exit__(self, *exc: object) -> bool: ...

class RemotePtr:
    """An allocation in the pool. ``str(ptr)`` is ``node:offset:len:incarnation``."""

    @staticmethod
    def parse(text: str) -> RemotePtr: ...
    @property
    def node(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def len(self) -> int: ...
    @property
    def incarnation(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

BatchOp = (
    tuple[Literal["read", "write"], RemotePtr, RegisteredBuffer]
    | tuple[Literal["read", "write"], RemotePtr, RegisteredBuffer, int]
    | tuple[Literal["cas"], RemotePtr, int, int, int]
    | tuple[Literal["faa"], RemotePtr, int, int]
)

class PoolClient:
    """A client of the remote memory pool: allocate, free, READ, WRITE, compare-and-swap
    and fetch-and-add on the servers' memory, one-sided."""

    def __init__(
        self,
        servers: Sequence[str] | str | None = None,
        *,
        etcd: Sequence[str] | str | None = None,
        etcd_prefix: str = "/rdmapool/pool",
        client_id: int | None = None,
        key_file: str | None = None,
        client_key_file: str | None = None,
        provider: Literal["soft", "verbs"] = "soft",
        device: str | None = None,
    ) -> None: ...
    @property
    def client_id(self) -> int: ...
    def alloc(self, size: int) -> RemotePtr: ...
    def free(self, ptr: RemotePtr) -> None: ...
    def write(self, ptr: RemotePtr, data: Buffer, offset: int = 0) -> None: ...
    def read(self, ptr: RemotePtr, offset: int = 0, length: int | None = None) -> bytes: ...
    def write_from(self, ptr: RemotePtr, view: RegisteredBuffer, offset: int = 0) -> None: ...
    def read_into(self, ptr: RemotePtr, view: RegisteredBuffer, offset: int = 0) -> None: ...
    def cas(self, ptr: RemotePtr, offset: int, expected: int, new: int) -> int: ...
    def faa(self, ptr: RemotePtr, offset: int, add: int) -> int: ...
    def register(self, buffer: Buffer | Any) -> RegisteredBuffer: ...
    def batch(self, ops: Sequence[BatchOp]) -> list[int | None | Exception]: ...
    def close(self) -> None: ...
    def __enter__(self) -> PoolClient: ...
    def __exit__(self, *exc: object) -> bool: ...

class MemoryServer:
    """A memory server in this process, serving until ``close`` (or the end of a ``with``)."""

    def __init__(
        self,
        size: int = 67108864,
        *,
        node: int = 1,
        listen: str = "127.0.0.1:0",
        chunk_size: int = 1048576,
        lease: float = 2.0,
        key_file: str | None = None,
        isolated: bool = False,
        provider: Literal["soft", "verbs"] = "soft",
        device: str | None = None,
    ) -> None: ...
    @property
    def addr(self) -> str: ...
    @property
    def node(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def close(self, drain: float = 0.0) -> int: ...
    def __enter__(self) -> MemoryServer: ...
    def __exit__(self, *exc: object) -> bool: ...
