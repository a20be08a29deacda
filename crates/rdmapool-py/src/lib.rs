//! `rdmapool._rdmapool`: the native half of the Python package `rdmapool` (docs/PYTHON.md).
//! The package's Python half (`python/rdmapool`) re-exports these classes, defines the
//! exceptions, and adds `rdmapool.aio` and `rdmapool.bench`.
//!
//! A file per concept: `errors.rs` which exception each error raises; `buffer.rs`
//! registered Python memory; `connect.rs` joining a cluster; `store.rs` the store;
//! `pool.rs` the pool client and pointers; `server.rs` memory servers; `bench.rs` the Rust
//! loop `python -m rdmapool.bench` compares with; this file the module and `devices()`.

use pyo3::prelude::*;
use pyo3::types::PyDict;

mod bench;
mod buffer;
mod connect;
mod errors;
mod pool;
mod server;
mod store;

/// The RDMA providers built in, with their devices, as dicts (`rdma-tool devices`).
#[pyfunction]
fn devices<'py>(py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let mut out = Vec::new();
    for p in rdmapool::devices() {
        let d = PyDict::new(py);
        d.set_item("provider", p.provider.name())?;
        d.set_item("available", p.unavailable.is_none())?;
        d.set_item("unavailable", p.unavailable.clone())?;
        let names: Vec<String> = p.devices.iter().map(|x| x.name.clone()).collect();
        d.set_item("devices", names)?;
        out.push(d);
    }
    Ok(out)
}

/// The native module.
#[pymodule]
fn _rdmapool(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(bench::rust_batches, m)?)?;
    m.add_class::<store::Store>()?;
    m.add_class::<buffer::RegisteredBuffer>()?;
    m.add_class::<pool::PoolClient>()?;
    m.add_class::<pool::RemotePtr>()?;
    m.add_class::<server::MemoryServer>()?;
    Ok(())
}
