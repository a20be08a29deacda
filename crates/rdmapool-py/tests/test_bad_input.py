"""Bad input to every public call raises an exception, never crashes the interpreter, and
loses nothing already stored."""

from __future__ import annotations

import itertools

import pytest

import rdmapool

GARBAGE = [
    None,
    -1,
    2**64,
    1.5,
    float("nan"),
    "",
    "x" * 100_000,
    b"",
    b"\xff" * 70_000,
    bytearray(3),
    [],
    [b"k"],
    [None],
    {},
    object(),
    memoryview(b"ab")[::2],
]

STORE_CALLS = [
    ("put", 2),
    ("get", 1),
    ("remove", 1),
    ("exists", 1),
    ("list", 1),
    ("register", 1),
    ("put_from", 2),
    ("get_into", 2),
    ("batch_put_from", 2),
    ("batch_get_into", 2),
    ("batch_exists", 1),
    ("get_many", 1),
    ("put_many", 2),
]

POOL_CALLS = [
    ("alloc", 1),
    ("free", 1),
    ("write", 2),
    ("read", 1),
    ("write_from", 2),
    ("read_into", 2),
    ("cas", 4),
    ("faa", 3),
    ("register", 1),
    ("batch", 1),
]

EXPECTED = (TypeError, ValueError, OverflowError, BufferError, rdmapool.RdmapoolError)


def _args(n):
    """Argument lists of length `n` drawn from GARBAGE: each value in every position."""
    for value in GARBAGE:
        for pos in range(n):
            args = [b"ok"] * n
            args[pos] = value
            yield args
    yield from ([a, b] for a, b in itertools.islice(itertools.product(GARBAGE, GARBAGE), 40))


def test_every_store_call_refuses_garbage_and_keeps_what_is_stored(store):
    store.put(b"keep", b"safe")
    for name, n in STORE_CALLS:
        for args in _args(n):
            args = args[:n]
            try:
                getattr(store, name)(*args)
            except EXPECTED:
                pass
            except BaseException as e:  # anything else is a bug
                pytest.fail(f"{name}{tuple(map(type, args))} raised {type(e).__name__}: {e}")
    assert store.get(b"keep") == b"safe"


def test_every_pool_call_refuses_garbage(addrs):
    pool = rdmapool.PoolClient(addrs)
    ptr = pool.alloc(16)
    pool.write(ptr, b"0123456789abcdef")
    for name, n in POOL_CALLS:
        for args in _args(n):
            args = args[:n]
            try:
                getattr(pool, name)(*args)
            except EXPECTED:
                pass
            except BaseException as e:
                pytest.fail(f"{name}{tuple(map(type, args))} raised {type(e).__name__}: {e}")
    assert pool.read(ptr) == b"0123456789abcdef"
    pool.close()


def test_constructors_refuse_garbage():
    for value in GARBAGE:
        for make in (
            lambda v: rdmapool.Store(v),
            lambda v: rdmapool.Store(["127.0.0.1:1"], replicas=v),
            lambda v: rdmapool.Store(["127.0.0.1:1"], grace=v),
            lambda v: rdmapool.PoolClient(v),
            lambda v: rdmapool.MemoryServer(v),
            lambda v: rdmapool.MemoryServer(1 << 20, listen=v),
            lambda v: rdmapool.RemotePtr.parse(v),
        ):
            try:
                made = make(value)
            except EXPECTED:
                continue
            if isinstance(made, rdmapool.MemoryServer):
                made.close()
