"""rdmapool from Python: a replicated, one-sided store on remote memory, the remote memory
pool under it, and zero-copy batch calls on registered buffers (docs/PYTHON.md).

>>> import rdmapool
>>> with rdmapool.MemoryServer(4 << 20, node=1) as a, rdmapool.MemoryServer(4 << 20, node=2) as b:
...     store = rdmapool.Store([a.addr, b.addr])
...     _ = store.put(b"greeting", b"hello")
...     store.get(b"greeting")
...     store.close()
b'hello'
"""

from __future__ import annotations

from ._rdmapool import (
    MemoryServer,
    PoolClient,
    RegisteredBuffer,
    RemotePtr,
    Store,
    __version__,
    devices,
)
from .errors import (
    BatchError,
    ClientIdInUse,
    Contended,
    ConnectionFailed,
    Damaged,
    MemlockLimit,
    NodeDown,
    NoServer,
    NotEnoughReplicas,
    OutOfLimits,
    OutOfMemory,
    ProviderUnavailable,
    RdmapoolError,
    StalePointer,
    TimedOut,
    Unauthenticated,
)

__all__ = [
    "MemoryServer",
    "PoolClient",
    "RegisteredBuffer",
    "RemotePtr",
    "Store",
    "__version__",
    "devices",
    "BatchError",
    "ClientIdInUse",
    "Contended",
    "ConnectionFailed",
    "Damaged",
    "MemlockLimit",
    "NodeDown",
    "NoServer",
    "NotEnoughReplicas",
    "OutOfLimits",
    "OutOfMemory",
    "ProviderUnavailable",
    "RdmapoolError",
    "StalePointer",
    "TimedOut",
    "Unauthenticated",
]
