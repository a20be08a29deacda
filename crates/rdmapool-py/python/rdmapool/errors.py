"""rdmapool's exceptions. Every failure the library reports is an ``RdmapoolError``; the
caller's bad input is also a ``ValueError``, a deadline a ``TimeoutError``, a failed
connection a ``ConnectionError``, so code written against the built-in classes catches
them too."""

from __future__ import annotations

__all__ = [
    "RdmapoolError",
    "NodeDown",
    "NoServer",
    "Damaged",
    "NotEnoughReplicas",
    "OutOfLimits",
    "Unauthenticated",
    "OutOfMemory",
    "Contended",
    "StalePointer",
    "ProviderUnavailable",
    "TimedOut",
    "ConnectionFailed",
    "ClientIdInUse",
    "MemlockLimit",
    "BatchError",
]


class RdmapoolError(Exception):
    """Every failure rdmapool reports (the base of its exceptions)."""


class NodeDown(RdmapoolError):
    """A memory server is down, unreachable, or this client's lease there lapsed."""


class NoServer(RdmapoolError):
    """No memory server is reachable."""


class Damaged(RdmapoolError):
    """The store found bytes of a key that do not check out (torn or reused)."""


class NotEnoughReplicas(RdmapoolError):
    """Fewer servers are up than a put's replicas need."""


class OutOfLimits(RdmapoolError, ValueError):
    """A bad argument: a number, size, range, key or buffer rdmapool does not take."""


class Unauthenticated(RdmapoolError):
    """A peer did not prove the cluster key or this client id's key."""


class OutOfMemory(RdmapoolError):
    """No server has room for the allocation or the put (or the index bucket is full)."""


class Contended(RdmapoolError):
    """An operation lost its race too many times; retry later."""


class StalePointer(RdmapoolError):
    """A pool pointer names a server incarnation that is gone, or no live object."""


class ProviderUnavailable(RdmapoolError):
    """The RDMA provider or device asked for cannot be opened here."""


class TimedOut(RdmapoolError, TimeoutError):
    """An operation ran past its deadline."""


class ConnectionFailed(RdmapoolError, ConnectionError):
    """A connection to a server could not be made or was refused."""


class ClientIdInUse(RdmapoolError):
    """Another live client holds this client id."""


class MemlockLimit(RdmapoolError):
    """Registering the memory would pass the locked-memory limit (``ulimit -l``)."""


class BatchError(RdmapoolError):
    """Some keys of a batch call failed. ``results`` holds every key's outcome, in order:
    the exception in place of each key that failed."""

    results: list[object]

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.results = []
