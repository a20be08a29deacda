"""Registered buffers and the zero-copy calls: lifetimes, read-only memory, bounds."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import rdmapool

PAGE = 4096


def test_batch_put_from_and_get_into_round_trip_numpy_pages(store):
    pages = np.random.default_rng(7).integers(0, 256, size=(128, PAGE), dtype=np.uint8)
    src = store.register(pages)
    keys = [f"page:{i}" for i in range(128)]
    versions = store.batch_put_from(keys, [src[i * PAGE : (i + 1) * PAGE] for i in range(128)])
    assert len(versions) == 128 and all(v[0] == 1 for v in versions)
    assert store.batch_exists(keys + ["page:none"]) == [True] * 128 + [False]
    out = np.zeros_like(pages)
    dst = store.register(out)
    lengths = store.batch_get_into(keys, [dst.view(i * PAGE, PAGE) for i in range(128)])
    assert lengths == [PAGE] * 128
    assert np.array_equal(out, pages)
    s = store.stats()
    assert s["bytes_copied"] == 0, "the zero-copy calls copied nothing"
    assert s["bytes_zero_copy"] == 2 * 128 * PAGE


def test_other_element_types_register_as_bytes(store):
    halves = np.arange(512, dtype=np.float16)
    buf = store.register(halves)
    assert buf.nbytes == 1024
    store.put_from(b"h", buf)
    assert store.get(b"h") == halves.tobytes()


def test_get_into_a_missing_key_is_none_and_a_short_view_is_refused(store):
    out = bytearray(8)
    dst = store.register(out)
    assert store.get_into(b"none", dst) is None
    store.put(b"long", b"0123456789")
    with pytest.raises(rdmapool.OutOfLimits):
        store.get_into(b"long", dst)
    assert store.get(b"long") == b"0123456789"
    big = store.register(bytearray(16))
    assert store.get_into(b"long", big) == 10
    assert big.tobytes()[:10] == b"0123456789"


def test_read_only_memory_is_for_puts_only(store):
    ro = store.register(b"immutable bytes")
    assert ro.readonly
    store.put_from(b"ro", ro)
    assert store.get(b"ro") == b"immutable bytes"
    with pytest.raises(rdmapool.OutOfLimits, match="read-only"):
        store.get_into(b"ro", ro)
    with pytest.raises(rdmapool.OutOfLimits):
        store.batch_get_into([b"ro"], [ro])
    assert store.get(b"ro") == b"immutable bytes"


def test_the_registered_object_stays_alive_and_fixed_in_size(store):
    data = bytearray(b"kept alive " * 100)
    want = bytes(data)
    buf = store.register(data)
    with pytest.raises(BufferError):
        data.extend(b"more")  # exported: the bytearray cannot move
    del data
    gc.collect()
    store.put_from(b"alive", buf)
    assert store.get(b"alive") == want
    view = buf[0:4]
    del buf
    gc.collect()
    store.put_from(b"slice", view)  # a slice keeps the registration too
    assert store.get(b"slice") == b"kept"


def test_a_released_registration_lets_the_object_resize(store):
    data = bytearray(64)
    buf = store.register(data)
    del buf
    gc.collect()
    data.extend(b"now it may")
    assert len(data) == 74


def test_views_are_bounded(store):
    buf = store.register(bytearray(100))
    assert len(buf[10:20]) == 10 and buf[10:20].offset == 10
    assert buf.view(90, 10).nbytes == 10
    for bad in ((95, 10), (0, 0), (101, 1)):
        with pytest.raises(rdmapool.OutOfLimits):
            buf.view(*bad)
    with pytest.raises(rdmapool.OutOfLimits):
        buf[5:5]
    with pytest.raises(rdmapool.OutOfLimits):
        buf[::2]
    with pytest.raises(OverflowError):
        buf.view(-1, 1)


def test_unregistrable_objects_are_refused(store):
    with pytest.raises(rdmapool.OutOfLimits):
        store.register(bytearray())
    with pytest.raises(rdmapool.OutOfLimits):
        store.register(np.zeros((8, 8), dtype=np.uint8)[:, ::2])  # not contiguous
    with pytest.raises(TypeError):
        store.register("a str has no buffer")


def test_a_buffer_of_another_client_is_refused(addrs, store):
    with rdmapool.Store(addrs) as other:
        theirs = other.register(bytearray(b"theirs"))
        with pytest.raises(rdmapool.OutOfLimits, match="another client"):
            store.put_from(b"k", theirs)
        with pytest.raises(rdmapool.OutOfLimits, match="another client"):
            store.batch_get_into([b"k"], [theirs])


def test_batches_check_their_lengths_and_report_each_key(store):
    buf = store.register(bytearray(24))
    with pytest.raises(rdmapool.OutOfLimits, match="2 keys but 1 buffers"):
        store.batch_put_from([b"a", b"b"], [buf])
    store.put(b"long", b"x" * 100)
    store.put(b"short", b"y" * 8)
    with pytest.raises(rdmapool.BatchError) as e:
        store.batch_get_into([b"short", b"long", b"none"], [buf[0:8], buf[8:16], buf[16:24]])
    results = e.value.results
    assert results[0] == 8 and results[2] is None
    assert isinstance(results[1], rdmapool.OutOfLimits)
    assert buf.tobytes()[:8] == b"y" * 8


class _DlpackOnly:
    """A DLPack producer with no buffer protocol (as a CPU torch tensor)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_a_dlpack_producer_registers_its_own_memory(store):
    src_array = np.arange(256, dtype=np.float32)
    src = store.register(_DlpackOnly(src_array))
    store.put_from(b"dl", src)
    out_array = np.zeros(256, dtype=np.float32)
    producer = _DlpackOnly(out_array)
    dst = store.register(producer)
    del producer
    gc.collect()
    assert store.get_into(b"dl", dst) == 1024
    assert np.array_equal(out_array, src_array), "written into the producer's memory, no copy"


def test_a_batch_into_overlapping_views_is_refused(store):
    store.put(b"x", b"1234")
    store.put(b"y", b"5678")
    buf = store.register(bytearray(16))
    with pytest.raises(rdmapool.BatchError) as e:
        store.batch_get_into([b"x", b"y"], [buf[0:8], buf[4:12]])
    assert all(isinstance(r, rdmapool.OutOfLimits) for r in e.value.results)
    assert "overlap" in str(e.value.results[0])
    assert store.batch_get_into([b"x", b"y"], [buf[0:8], buf[8:16]]) == [4, 4]
    assert buf.tobytes()[:4] + buf.tobytes()[8:12] == b"12345678"
