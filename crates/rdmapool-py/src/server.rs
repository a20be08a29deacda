//! `MemoryServer`: a memory server in this process (`rdmapool::remote::MemoryServer`), for
//! tests, notebooks and `python -m rdmapool.server`. It serves until `close()` or the end
//! of its `with` block.

use crate::connect::open_context;
use crate::errors::{bad_arg, raise, IntoPyResult};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use rdmapool::fabric::{Context, PreSharedKey};
use rdmapool::remote::{Isolation, MemoryServer as RustServer, ServerConfig};
use std::time::Duration;

/// A memory server that exports registered memory to pool and store clients.
#[pyclass(frozen, module = "rdmapool", name = "MemoryServer")]
pub struct MemoryServer {
    /// The server and the context it runs on, until closed.
    running: Mutex<Option<(RustServer, Context)>>,
    addr: String,
    node: u32,
}

#[pymethods]
impl MemoryServer {
    /// Starts a server exporting `size` bytes as node `node`, listening on `listen`
    /// (`"ip:port"`, port 0 for any free one); see docs/PYTHON.md.
    #[new]
    #[pyo3(signature = (size=64 << 20, *, node=1, listen="127.0.0.1:0".to_string(),
        chunk_size=1 << 20, lease=2.0, key_file=None, isolated=false,
        provider="soft".to_string(), device=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        size: usize,
        node: u32,
        listen: String,
        chunk_size: u64,
        lease: f64,
        key_file: Option<String>,
        isolated: bool,
        provider: String,
        device: Option<String>,
    ) -> PyResult<Self> {
        let listen = listen
            .parse()
            .map_err(|e| bad_arg(py, format!("listen {listen:?}: {e} (want ip:port)")))?;
        let lease = Duration::try_from_secs_f64(lease)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| bad_arg(py, format!("lease: {lease} s (want a positive number)")))?;
        let cluster_key = key_file
            .as_deref()
            .map(PreSharedKey::from_file)
            .transpose()
            .map_err(rdmapool::Error::from)
            .py(py)?;
        let ctx = open_context(py, &provider, device.as_deref())?;
        let cfg = ServerConfig {
            node,
            size,
            chunk_size,
            lease,
            listen,
            cluster_key,
            isolation: if isolated {
                Isolation::Isolated
            } else {
                Isolation::Trusted
            },
            ..ServerConfig::default()
        };
        let server = py.detach(|| RustServer::start(&ctx, cfg)).py(py)?;
        Ok(Self {
            addr: server.addr().to_string(),
            node,
            running: Mutex::new(Some((server, ctx))),
        })
    }

    /// Where clients reach it: `"ip:port"`.
    #[getter]
    fn addr(&self) -> String {
        self.addr.clone()
    }

    /// Its node id.
    #[getter]
    fn node(&self) -> u32 {
        self.node
    }

    /// Its counters, as a dict (`ServerStats`); `requests_handled` stays 0 while clients
    /// only READ, WRITE and run atomics: the server's CPU takes no part.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let running = self.running.lock();
        let Some((server, _)) = running.as_ref() else {
            return Err(raise(py, "RdmapoolError", "the server is closed".into()));
        };
        let s = server.stats();
        let d = PyDict::new(py);
        d.set_item("chunks", s.chunks)?;
        d.set_item("chunks_owned", s.chunks_owned)?;
        d.set_item("clients", s.clients)?;
        d.set_item("connections", s.connections)?;
        d.set_item("connected", s.connected)?;
        d.set_item("reclaimed_chunks", s.reclaimed_chunks)?;
        d.set_item("expired_clients", s.expired_clients)?;
        d.set_item("requests_handled", s.requests_handled)?;
        Ok(d)
    }

    /// Stops serving: with `drain` seconds, first waits up to that long for clients to give
    /// their chunks back. Returns the chunks still leased when it stopped. Idempotent.
    #[pyo3(signature = (drain=0.0))]
    fn close(&self, py: Python<'_>, drain: f64) -> PyResult<u64> {
        let drain = Duration::try_from_secs_f64(drain)
            .map_err(|_| bad_arg(py, format!("drain: {drain} s")))?;
        let taken = self.running.lock().take();
        Ok(match taken {
            Some((server, ctx)) => py.detach(move || {
                let left = server.shutdown(drain);
                drop(ctx);
                left
            }),
            None => 0,
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py, 0.0)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("MemoryServer(node={}, addr={:?})", self.node, self.addr)
    }
}
