//! `PoolClient` and `RemotePtr`: the remote memory pool (`rdmapool::remote::PoolClient`)
//! from Python. `read`/`write` go through registered scratch buffers this client keeps
//! (one copy each way); `read_into`/`write_from` and `batch` move the bytes of registered
//! views with no copy.

use crate::buffer::RegisteredBuffer;
use crate::connect::{self, Join};
use crate::errors::{bad_arg, raise, IntoPyResult};
use crate::store::copy_of;
use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use rdmapool::fabric::{AccessFlags, Alloc, Mr, RegisteredMemory, Shared};
use rdmapool::remote::{EtcdFollower, PoolClient as RustClient, RemotePtr as RustPtr};
use std::sync::Arc;

/// An allocation in the pool: node, offset, length and the node's incarnation. Its text
/// form (`str(ptr)`, `RemotePtr.parse`) is `rdma-tool pool`'s `node:offset:len:incarnation`.
#[pyclass(frozen, eq, hash, module = "rdmapool", name = "RemotePtr")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemotePtr(pub RustPtr);

#[pymethods]
impl RemotePtr {
    /// The pointer a text form names (as `str(ptr)` gives).
    #[staticmethod]
    fn parse(py: Python<'_>, text: &str) -> PyResult<Self> {
        text.parse::<RustPtr>().map(Self).py(py)
    }

    /// The node (a server's id).
    #[getter]
    fn node(&self) -> u32 {
        self.0.node
    }

    /// Offset in the node's region.
    #[getter]
    fn offset(&self) -> u64 {
        self.0.offset
    }

    /// Bytes allocated.
    #[getter]
    fn len(&self) -> u64 {
        self.0.len
    }

    /// The incarnation of the node the allocation was made in.
    #[getter]
    fn incarnation(&self) -> u64 {
        self.0.incarnation
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        format!("RemotePtr('{}')", self.0)
    }
}

/// A client of the remote memory pool.
#[pyclass(frozen, module = "rdmapool", name = "PoolClient")]
pub struct PoolClient {
    /// The client, until `close` takes it (its lease and connections end with the last
    /// call under way).
    client: RwLock<Option<Arc<RustClient>>>,
    client_id: u64,
    /// What this client's registered buffers are marked with (`buffer::new_owner`).
    owner: u64,
    _follower: Option<EtcdFollower>,
    /// Registered buffers `read` and `write` copy through, reused.
    scratch: Mutex<Vec<Mr<Alloc>>>,
}

/// The most bytes one `read`/`write` moves (a work request's length is 32 bits).
const MAX_TRANSFER: u64 = u32::MAX as u64;

impl PoolClient {
    /// The client, refused once closed.
    fn client(&self, py: Python<'_>) -> PyResult<Arc<RustClient>> {
        self.client
            .read()
            .clone()
            .ok_or_else(|| raise(py, "RdmapoolError", "the pool client is closed".into()))
    }

    /// A registered scratch buffer of at least `len` bytes, of `client`'s protection domain.
    fn scratch(&self, client: &RustClient, len: usize) -> rdmapool::Result<Mr<Alloc>> {
        let mut kept = self.scratch.lock();
        if let Some(i) = kept.iter().position(|m| m.len() >= len) {
            return Ok(kept.swap_remove(i));
        }
        drop(kept);
        let size = len.next_power_of_two().max(4096);
        Ok(client.pd().alloc_mr(size, AccessFlags::LOCAL_WRITE)?)
    }

    fn give_back(&self, mr: Mr<Alloc>) {
        let mut kept = self.scratch.lock();
        if kept.len() < 8 {
            kept.push(mr);
        }
    }

    fn span(py: Python<'_>, ptr: &RustPtr, offset: u64, length: Option<u64>) -> PyResult<u32> {
        let len = length.unwrap_or(ptr.len.saturating_sub(offset));
        if len == 0 || len > MAX_TRANSFER {
            return Err(bad_arg(
                py,
                format!("a transfer of {len} bytes (1 to {MAX_TRANSFER})"),
            ));
        }
        Ok(len as u32)
    }
}

#[pymethods]
impl PoolClient {
    /// Joins the servers (or the etcd membership) as pool client `client_id`.
    #[new]
    #[pyo3(signature = (servers=None, *, etcd=None, etcd_prefix=connect::ETCD_PREFIX.to_string(),
        client_id=None, key_file=None, client_key_file=None, provider="soft".to_string(),
        device=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        servers: Option<&Bound<'_, PyAny>>,
        etcd: Option<&Bound<'_, PyAny>>,
        etcd_prefix: String,
        client_id: Option<u64>,
        key_file: Option<String>,
        client_key_file: Option<String>,
        provider: String,
        device: Option<String>,
    ) -> PyResult<Self> {
        let joined = connect::join(
            py,
            Join {
                servers: connect::server_list(servers)?,
                etcd: connect::server_list(etcd)?,
                etcd_prefix,
                client_id,
                key_file,
                client_key_file,
                provider,
                device,
            },
        )?;
        Ok(Self {
            client_id: joined.client.client_id(),
            client: RwLock::new(Some(joined.client)),
            owner: crate::buffer::new_owner(),
            _follower: joined._follower,
            scratch: Mutex::new(Vec::new()),
        })
    }

    /// This client's id.
    #[getter]
    fn client_id(&self) -> u64 {
        self.client_id
    }

    /// Allocates `size` bytes on some server.
    fn alloc(&self, py: Python<'_>, size: u64) -> PyResult<RemotePtr> {
        let c = &*self.client(py)?;
        let p = py.detach(|| c.block_on(c.alloc(size, None))).py(py)?;
        Ok(RemotePtr(p))
    }

    /// Frees an allocation.
    fn free(&self, py: Python<'_>, ptr: &RemotePtr) -> PyResult<()> {
        let (c, p) = (&*self.client(py)?, ptr.0);
        py.detach(|| c.block_on(c.free(p))).py(py)
    }

    /// Writes `data` (bytes or any buffer) at `offset` of `ptr`.
    #[pyo3(signature = (ptr, data, offset=0))]
    fn write(
        &self,
        py: Python<'_>,
        ptr: &RemotePtr,
        data: &Bound<'_, PyAny>,
        offset: u64,
    ) -> PyResult<()> {
        let bytes = copy_of(data)?;
        let len = Self::span(py, &ptr.0, offset, Some(bytes.len() as u64))?;
        let scratch = self.scratch(&*self.client(py)?, bytes.len()).py(py)?;
        scratch.write_at(0, &bytes).py(py)?;
        let (c, p) = (&*self.client(py)?, ptr.0);
        let (r, scratch) = py.detach(|| c.block_on(c.write(p, offset, scratch, 0, len)));
        self.give_back(scratch);
        r.py(py)
    }

    /// Reads `length` bytes (default: to the end of the allocation) at `offset` of `ptr`.
    #[pyo3(signature = (ptr, offset=0, length=None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        ptr: &RemotePtr,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let len = Self::span(py, &ptr.0, offset, length)?;
        let scratch = self.scratch(&*self.client(py)?, len as usize).py(py)?;
        let (c, p) = (&*self.client(py)?, ptr.0);
        let (r, scratch) = py.detach(|| c.block_on(c.read(p, offset, scratch, 0, len)));
        let mut out = vec![0u8; len as usize];
        let copied = r.and_then(|()| Ok(scratch.read_at(0, &mut out)?));
        self.give_back(scratch);
        copied.py(py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Writes the bytes of the registered `view` at `offset` of `ptr`, with no copy.
    #[pyo3(signature = (ptr, view, offset=0))]
    fn write_from(
        &self,
        py: Python<'_>,
        ptr: &RemotePtr,
        view: PyRef<'_, RegisteredBuffer>,
        offset: u64,
    ) -> PyResult<()> {
        let len = Self::span(py, &ptr.0, offset, Some(view.len() as u64))?;
        let mr = view.shared(py, self.owner)?;
        let (c, p) = (&*self.client(py)?, ptr.0);
        py.detach(|| c.block_on(c.write(p, offset, mr, 0, len)).0)
            .py(py)
    }

    /// Reads `len(view)` bytes at `offset` of `ptr` into the registered, writable `view`,
    /// with no copy.
    #[pyo3(signature = (ptr, view, offset=0))]
    fn read_into(
        &self,
        py: Python<'_>,
        ptr: &RemotePtr,
        view: PyRef<'_, RegisteredBuffer>,
        offset: u64,
    ) -> PyResult<()> {
        let len = Self::span(py, &ptr.0, offset, Some(view.len() as u64))?;
        let mr = view.writable(py, self.owner, "read_into")?;
        let (c, p) = (&*self.client(py)?, ptr.0);
        py.detach(|| c.block_on(c.read(p, offset, mr, 0, len)).0)
            .py(py)
    }

    /// Compare-and-swap on the 8-byte word at `offset` of `ptr`: the word's old value (the
    /// swap took place when it equals `expected`).
    fn cas(
        &self,
        py: Python<'_>,
        ptr: &RemotePtr,
        offset: u64,
        expected: u64,
        new: u64,
    ) -> PyResult<u64> {
        let (c, p) = (&*self.client(py)?, ptr.0);
        py.detach(|| c.block_on(c.compare_and_swap(p, offset, expected, new)))
            .py(py)
    }

    /// Fetch-and-add on the 8-byte word at `offset` of `ptr` (wrapping): its old value.
    fn faa(&self, py: Python<'_>, ptr: &RemotePtr, offset: u64, add: u64) -> PyResult<u64> {
        let (c, p) = (&*self.client(py)?, ptr.0);
        py.detach(|| c.block_on(c.fetch_and_add(p, offset, add)))
            .py(py)
    }

    /// Registers `buffer` (any C-contiguous object with the buffer protocol) for
    /// `read_into`, `write_from` and `batch`.
    fn register(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<RegisteredBuffer> {
        RegisteredBuffer::register(py, self.client(py)?.pd(), self.owner, buffer)
    }

    /// Closes the client: later calls raise, and its lease and connections end (once calls
    /// under way in other threads return), so its client id may join again. Idempotent.
    fn close(&self, py: Python<'_>) {
        let taken = self.client.write().take();
        self.scratch.lock().clear();
        py.detach(move || drop(taken));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    /// Runs operations together: per server, one list with one doorbell. Each operation is
    /// a tuple: `("read", ptr, view[, offset])`, `("write", ptr, view[, offset])`,
    /// `("cas", ptr, offset, expected, new)` or `("faa", ptr, offset, add)`. Returns one
    /// result per operation, in order: `None` for a read or write, the old word for an
    /// atomic, or the exception of an operation that failed (nothing is raised for those:
    /// check each).
    fn batch<'py>(
        &self,
        py: Python<'py>,
        ops: Vec<Bound<'py, PyTuple>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let client = self.client(py)?;
        let mut b = client.batch::<Mr<Shared>>();
        for op in &ops {
            let kind: String = op.get_item(0)?.extract()?;
            let ptr: PyRef<'_, RemotePtr> = op.get_item(1)?.extract()?;
            let p = ptr.0;
            let opt = |i: usize| -> PyResult<u64> {
                if op.len() > i {
                    op.get_item(i)?.extract()
                } else {
                    Ok(0)
                }
            };
            match (kind.as_str(), op.len()) {
                ("read" | "write", 3 | 4) => {
                    let view: PyRef<'_, RegisteredBuffer> = op.get_item(2)?.extract()?;
                    let len = Self::span(py, &p, opt(3)?, Some(view.len() as u64))?;
                    if kind == "read" {
                        b.read(
                            p,
                            opt(3)?,
                            view.writable(py, self.owner, "batch read")?,
                            0,
                            len,
                        );
                    } else {
                        b.write(p, opt(3)?, view.shared(py, self.owner)?, 0, len);
                    }
                }
                ("cas", 5) => {
                    b.compare_and_swap(p, aligned(py, &p, opt(2)?)?, opt(3)?, opt(4)?);
                }
                ("faa", 4) => {
                    b.fetch_and_add(p, aligned(py, &p, opt(2)?)?, opt(3)?);
                }
                _ => {
                    return Err(bad_arg(
                        py,
                        format!(
                            "batch operation ({kind:?} with {} fields): want (\"read\"|\"write\", \
                             ptr, view[, offset]), (\"cas\", ptr, offset, expected, new) or \
                             (\"faa\", ptr, offset, add)",
                            op.len()
                        ),
                    ))
                }
            }
        }
        let c = &*self.client(py)?;
        let outcomes = py.detach(|| c.block_on(b.run()));
        let out: Vec<Bound<'py, PyAny>> = outcomes
            .into_iter()
            .map(|o| match o.result {
                Ok(Some(old)) => Ok(old.into_pyobject(py)?.into_any()),
                Ok(None) => Ok(py.None().into_bound(py)),
                Err(e) => Ok(crate::errors::to_py(py, e)
                    .into_value(py)
                    .into_bound(py)
                    .into_any()),
            })
            .collect::<PyResult<_>>()?;
        PyList::new(py, out)
    }
}

/// `offset`, when the word at `offset` of `ptr` is 8-byte aligned, as RDMA atomics need
/// (checked before a batch is posted: one misaligned atomic would fail its whole list).
fn aligned(py: Python<'_>, ptr: &RustPtr, offset: u64) -> PyResult<u64> {
    if !ptr.offset.wrapping_add(offset).is_multiple_of(8) {
        return Err(bad_arg(
            py,
            format!("an atomic at offset {offset} of {ptr}: the word is not 8-byte aligned"),
        ));
    }
    Ok(offset)
}
