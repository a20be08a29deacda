//! The Rust side of `python -m rdmapool.bench`: the same batches as `batch_put_from` and
//! `batch_get_into`, looped in Rust on the same store and memory, so the Python call's own
//! cost is the difference between the two in one run.

use crate::buffer::RegisteredBuffer;
use crate::store::Store;
use pyo3::prelude::*;

/// Runs `rounds` batches of `len(keys)` pages of `page` bytes between `buffer` (page `i` at
/// `i * page`) and the store through the Rust API (`put_from` of every key at once, or
/// `get_into_many`, as the Python batch calls do); returns the seconds they took. A failed key fails
/// the run.
#[pyfunction]
pub fn rust_batches(
    py: Python<'_>,
    store: PyRef<'_, Store>,
    keys: Vec<Vec<u8>>,
    buffer: PyRef<'_, RegisteredBuffer>,
    page: usize,
    rounds: usize,
    put: bool,
) -> PyResult<f64> {
    let s = store.inner(py)?;
    let views = (0..keys.len())
        .map(|i| buffer.view_of(py, store.owner(), i * page, page))
        .collect::<PyResult<Vec<_>>>()?;
    let failed = py.detach(|| {
        let t = std::time::Instant::now();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let views: Vec<&rdmapool::fabric::Mr<rdmapool::fabric::Shared>> = views.iter().collect();
        for _ in 0..rounds {
            let bad = if put {
                let r = s.block_on(s.put_from_many(&keys, &views));
                r.into_iter().find_map(Result::err)
            } else {
                let r = s.block_on(s.get_into_many(&keys, &views));
                r.into_iter().find_map(Result::err)
            };
            if let Some(e) = bad {
                return Err(e);
            }
        }
        Ok(t.elapsed().as_secs_f64())
    });
    failed.map_err(|e| crate::errors::to_py(py, e))
}
