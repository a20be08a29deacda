//! `RegisteredBuffer`: memory a Python object exports through the buffer protocol
//! (`bytearray`, `memoryview`, a NumPy array, a CPU tensor through NumPy), registered with
//! the client's protection domain so the store and the pool move its bytes with no copy.
//!
//! The registration holds the object's buffer export (a `Py_buffer`) for as long as any
//! view of it lives: the object stays alive, and exporters that can resize (a `bytearray`)
//! refuse to while it is exported. Slices (`buf[a:b]`, `buf.view(offset, length)`) share
//! the one registration.

use crate::errors::{bad_arg, IntoPyResult};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PySlice};
use rdmapool::fabric::{AccessFlags, Mr, Pd, Shared, StableBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A Python object's exported bytes, kept exported while the value lives.
pub struct PythonMemory {
    export: PyUntypedBuffer,
}

// SAFETY: the buffer protocol promises that `buf_ptr`/`len_bytes` of a held export stay
// valid and in place until the export is released, which happens only when `export` drops
// (after the registration that owns this value is gone: `Mr<B>` drops its registration
// before its buffer). Both calls return the fields of the held `Py_buffer`, the same every
// time. A writable export is valid for writes; a read-only one is registered without
// LOCAL_WRITE (`register`), so neither the device nor this crate writes it.
unsafe impl StableBuf for PythonMemory {
    fn stable_ptr(&mut self) -> *mut u8 {
        self.export.buf_ptr().cast()
    }
    fn stable_len(&self) -> usize {
        self.export.len_bytes()
    }
}

/// A registration of a Python object's memory, or a slice of one (`RegisteredBuffer` in
/// Python): what the zero-copy calls (`put_from`, `get_into`, their batches, the pool's
/// `read_into`/`write_from`) take.
#[pyclass(frozen, module = "rdmapool", name = "RegisteredBuffer")]
pub struct RegisteredBuffer {
    mr: Arc<Mr<PythonMemory>>,
    /// The client it was registered by ([`new_owner`]): a client refuses buffers of
    /// another one, whose protection domain's keys its operations cannot use.
    owner: u64,
    readonly: bool,
    offset: usize,
    len: usize,
}

/// A number no other client of this process has: what a client's buffers are marked with.
pub fn new_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl RegisteredBuffer {
    /// Registers `obj`'s exported bytes with `pd`, the protection domain of client `owner`.
    pub fn register(py: Python<'_>, pd: &Pd, owner: u64, obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let export = match PyUntypedBuffer::get(obj) {
            Ok(export) => export,
            // A DLPack producer without the buffer protocol (a CPU torch tensor, a JAX or
            // CuPy host array): NumPy's view of the same memory, which keeps the producer's
            // capsule, and so the memory, alive while the registration holds it.
            Err(e) if obj.hasattr("__dlpack__")? => {
                let array = py
                    .import("numpy")
                    .and_then(|np| np.call_method1("from_dlpack", (obj,)))
                    .map_err(|_| e)?;
                PyUntypedBuffer::get(&array)?
            }
            Err(e) => return Err(e),
        };
        if !export.is_c_contiguous() {
            return Err(bad_arg(
                py,
                "register: the buffer is not C-contiguous (make a contiguous copy first, e.g. \
                 numpy.ascontiguousarray)",
            ));
        }
        let (len, readonly) = (export.len_bytes(), export.readonly());
        if len == 0 {
            return Err(bad_arg(py, "register: the buffer is empty"));
        }
        let access = if readonly {
            AccessFlags::empty()
        } else {
            AccessFlags::LOCAL_WRITE
        };
        let mr = py
            .detach(|| pd.register(PythonMemory { export }, access))
            .map_err(|e| rdmapool::Error::Core(e.error))
            .py(py)?;
        Ok(Self {
            mr: Arc::new(mr),
            owner,
            readonly,
            offset: 0,
            len,
        })
    }

    /// A view of this buffer's bytes for one operation of client `owner`, keeping the
    /// registration alive; refused when it was registered by another client.
    pub fn shared(&self, py: Python<'_>, owner: u64) -> PyResult<Mr<Shared>> {
        if self.owner != owner {
            return Err(bad_arg(
                py,
                "the buffer was registered by another client: register it with the client \
                 that uses it (each client has its own protection domain)",
            ));
        }
        Mr::share_range(&self.mr, self.offset, self.len).py(py)
    }

    /// This buffer's view, refused when it is read-only (`what` names the call).
    pub fn writable(&self, py: Python<'_>, owner: u64, what: &str) -> PyResult<Mr<Shared>> {
        if self.readonly {
            return Err(bad_arg(
                py,
                format!("{what}: the buffer is read-only (register a writable object)"),
            ));
        }
        self.shared(py, owner)
    }

    /// A view of `length` bytes at `offset` of this one, for an operation of client `owner`
    /// (as `shared`).
    pub fn view_of(
        &self,
        py: Python<'_>,
        owner: u64,
        offset: usize,
        length: usize,
    ) -> PyResult<Mr<Shared>> {
        self.sub(py, offset, length)?.shared(py, owner)
    }

    /// Bytes in this view.
    pub fn len(&self) -> usize {
        self.len
    }

    fn sub(&self, py: Python<'_>, offset: usize, length: usize) -> PyResult<Self> {
        if offset.checked_add(length).is_none_or(|end| end > self.len) {
            return Err(bad_arg(
                py,
                format!(
                    "view of {length} bytes at offset {offset} of a {}-byte buffer",
                    self.len
                ),
            ));
        }
        if length == 0 {
            return Err(bad_arg(py, "an empty view"));
        }
        Ok(Self {
            mr: self.mr.clone(),
            owner: self.owner,
            readonly: self.readonly,
            offset: self.offset + offset,
            len: length,
        })
    }
}

#[pymethods]
impl RegisteredBuffer {
    /// Bytes in this view.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// Where this view starts in the registered object, in bytes.
    #[getter]
    fn offset(&self) -> usize {
        self.offset
    }

    /// True when the object exported its bytes read-only: `put_from` only.
    #[getter]
    fn readonly(&self) -> bool {
        self.readonly
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// A view of `length` bytes at `offset` of this one, sharing its registration.
    fn view(&self, py: Python<'_>, offset: usize, length: usize) -> PyResult<Self> {
        self.sub(py, offset, length)
    }

    /// `buf[a:b]`: a view of those bytes (step 1 only).
    fn __getitem__(&self, py: Python<'_>, index: &Bound<'_, PySlice>) -> PyResult<Self> {
        let s = index.indices(self.len as isize)?;
        if s.step != 1 {
            return Err(bad_arg(py, "a registered buffer's slice has step 1"));
        }
        self.sub(py, s.start as usize, (s.stop - s.start).max(0) as usize)
    }

    /// A copy of this view's bytes (for checks and debugging; the data path never copies).
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = vec![0u8; self.len];
        self.mr.read_at(self.offset, &mut out).py(py)?;
        Ok(PyBytes::new(py, &out))
    }

    fn __repr__(&self) -> String {
        format!(
            "RegisteredBuffer(nbytes={}, offset={}, readonly={})",
            self.len,
            self.offset,
            if self.readonly { "True" } else { "False" }
        )
    }
}
