//! `Store`: the replicated store (`rdmapool::store::Store`) from Python. Every call releases
//! the GIL while it runs; the batch calls run all their keys' operations at once, each step
//! of every key in flight together.

use crate::buffer::RegisteredBuffer;
use crate::connect::{self, Join};
use crate::errors::{bad_arg, raise, to_py, IntoPyResult};
use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};
use rdmapool::fabric::{Mr, Shared};
use rdmapool::remote::EtcdFollower;
use rdmapool::store::{
    CacheConfig, Eviction, Pin, PutOptions, Store as RustStore, StoreConfig, Version,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A client of the replicated store (`rdmapool.Store` in Python; docs/PYTHON.md).
#[pyclass(frozen, module = "rdmapool", name = "Store")]
pub struct Store {
    /// The store, until `close` takes it (its pool client's lease and connections end
    /// with the last call under way).
    store: RwLock<Option<Arc<RustStore>>>,
    client_id: u64,
    /// What this client's registered buffers are marked with (`buffer::new_owner`).
    owner: u64,
    _follower: Option<EtcdFollower>,
    /// Value bytes this binding copied between Python objects and Rust memory (`put` of a
    /// non-`bytes` value, `get`'s result); the zero-copy calls add nothing.
    copied: AtomicU64,
    /// Value bytes the zero-copy calls moved.
    zero_copy: AtomicU64,
}

/// A batch call's keys, and a registered view per key.
type KeysAndViews = (Vec<Vec<u8>>, Vec<Mr<Shared>>);

/// A key: `bytes`, or a `str` (its UTF-8 bytes).
pub fn key_of(py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = key.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(s) = key.cast::<PyString>() {
        return Ok(s.to_str()?.as_bytes().to_vec());
    }
    Err(bad_arg(
        py,
        format!(
            "a key is bytes or str, not {}",
            key.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ),
    ))
}

fn keys_of(py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u8>>> {
    keys.try_iter()?
        .map(|k| key_of(py, &k?))
        .collect::<PyResult<Vec<_>>>()
}

fn version<'py>(py: Python<'py>, v: Version) -> PyResult<Bound<'py, PyAny>> {
    Ok((v.seq, v.writer).into_pyobject(py)?.into_any())
}

fn seconds(py: Python<'_>, what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            bad_arg(
                py,
                format!("{what}: {s} s (want a positive number of seconds)"),
            )
        })
}

/// Raises `BatchError` when any of `results` failed: its `results` attribute holds every
/// key's outcome, the exception in place of each failed one; else the outcomes.
fn batch<'py, T>(
    py: Python<'py>,
    what: &str,
    results: Vec<rdmapool::Result<T>>,
    ok: impl Fn(Python<'py>, T) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let mut out = Vec::with_capacity(results.len());
    let mut failed = 0;
    let mut first = None;
    for r in results {
        match r {
            Ok(v) => out.push(ok(py, v)?),
            Err(e) => {
                failed += 1;
                let exc = to_py(py, e);
                first.get_or_insert_with(|| exc.to_string());
                out.push(exc.into_value(py).into_bound(py).into_any());
            }
        }
    }
    let list = PyList::new(py, out)?;
    if failed > 0 {
        let err = raise(
            py,
            "BatchError",
            format!(
                "{what}: {failed} of {} keys failed (the first: {})",
                list.len(),
                first.unwrap_or_default()
            ),
        );
        err.value(py).setattr("results", &list)?;
        return Err(err);
    }
    Ok(list)
}

impl Store {
    /// The Rust store, refused once closed.
    pub fn inner(&self, py: Python<'_>) -> PyResult<Arc<RustStore>> {
        self.store(py)
    }

    /// What this client's registered buffers are marked with.
    pub fn owner(&self) -> u64 {
        self.owner
    }

    fn store(&self, py: Python<'_>) -> PyResult<Arc<RustStore>> {
        self.store
            .read()
            .clone()
            .ok_or_else(|| raise(py, "RdmapoolError", "the store is closed".into()))
    }

    /// The keys of a batch call `what` and its views, one per key: the views for reads into
    /// them (`writable`, refused when read-only) or for writes from them.
    fn pairs(
        &self,
        py: Python<'_>,
        what: &str,
        keys: &Bound<'_, PyAny>,
        views: &[PyRef<'_, RegisteredBuffer>],
        writable: bool,
    ) -> PyResult<KeysAndViews> {
        let keys = keys_of(py, keys)?;
        if keys.len() != views.len() {
            return Err(bad_arg(
                py,
                format!("{what}: {} keys but {} buffers", keys.len(), views.len()),
            ));
        }
        let mrs = views
            .iter()
            .map(|v| {
                if writable {
                    v.writable(py, self.owner, what)
                } else {
                    v.shared(py, self.owner)
                }
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok((keys, mrs))
    }
}

#[pymethods]
impl Store {
    /// Joins the servers (or the etcd membership) as a store client; see docs/PYTHON.md.
    #[new]
    #[pyo3(signature = (servers=None, *, etcd=None, etcd_prefix=connect::ETCD_PREFIX.to_string(),
        replicas=2, client_id=None, key_file=None, client_key_file=None, grace=1.0,
        part_size=256 * 1024, provider="soft".to_string(), device=None, cache_budget=None,
        eviction="lru".to_string(), soft_pin=1800.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        servers: Option<&Bound<'_, PyAny>>,
        etcd: Option<&Bound<'_, PyAny>>,
        etcd_prefix: String,
        replicas: usize,
        client_id: Option<u64>,
        key_file: Option<String>,
        client_key_file: Option<String>,
        grace: f64,
        part_size: u64,
        provider: String,
        device: Option<String>,
        cache_budget: Option<u64>,
        eviction: String,
        soft_pin: f64,
    ) -> PyResult<Self> {
        let cache = match cache_budget {
            None => None,
            Some(budget) => Some(CacheConfig {
                policy: match eviction.as_str() {
                    "lru" => Eviction::Lru,
                    "lfu" => Eviction::Lfu,
                    other => {
                        return Err(bad_arg(
                            py,
                            format!("eviction: {other:?}; \"lru\" or \"lfu\""),
                        ))
                    }
                },
                soft_pin: seconds(py, "soft_pin", soft_pin)?,
                ..CacheConfig::new(budget)
            }),
        };
        let cfg = StoreConfig {
            replicas,
            grace: seconds(py, "grace", grace)?,
            part_size,
            cache,
            ..StoreConfig::default()
        };
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
        let client_id = joined.client.client_id();
        let store = RustStore::new(joined.client, cfg).py(py)?;
        Ok(Self {
            store: RwLock::new(Some(Arc::new(store))),
            client_id,
            owner: crate::buffer::new_owner(),
            _follower: joined._follower,
            copied: AtomicU64::new(0),
            zero_copy: AtomicU64::new(0),
        })
    }

    /// This client's id.
    #[getter]
    fn client_id(&self) -> u64 {
        self.client_id
    }

    /// Stores `value` (bytes or any buffer) under `key`; returns its version `(seq, writer)`.
    /// With `ttl` (seconds), the value is gone once that has passed (docs/STORE.md 11); with
    /// `pin` ("hard" or "soft"), a cache evicts it never, or only when nothing else is left
    /// (docs/STORE.md 12).
    #[pyo3(signature = (key, value, ttl=None, pin=None))]
    fn put<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        value: &Bound<'py, PyAny>,
        ttl: Option<&Bound<'py, PyAny>>,
        pin: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let store = self.store(py)?;
        let key = key_of(py, key)?;
        let options = PutOptions {
            ttl: ttl_of(py, ttl)?,
            pin: pin_of(py, pin)?,
        };
        let put = |bytes: &[u8]| store.block_on(store.put_with_options(&key, bytes, options));
        let v = if let Ok(b) = value.cast::<PyBytes>() {
            // `bytes` is immutable: read in place while the caller's reference keeps it.
            let bytes = b.as_bytes();
            py.detach(|| put(bytes))
        } else {
            let copy: Vec<u8> = copy_of(value)?;
            self.copied.fetch_add(copy.len() as u64, Ordering::Relaxed);
            py.detach(|| put(&copy))
        };
        version(py, v.py(py)?)
    }

    /// The value stored under `key`, or `None`.
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let store = self.store(py)?;
        let key = key_of(py, key)?;
        let got = py.detach(|| store.block_on(store.get(&key))).py(py)?;
        Ok(got.map(|v| {
            self.copied.fetch_add(v.len() as u64, Ordering::Relaxed);
            PyBytes::new(py, &v)
        }))
    }

    /// Removes `key`; True when it held a value.
    fn remove(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let store = self.store(py)?;
        let key = key_of(py, key)?;
        py.detach(|| store.block_on(store.remove(&key))).py(py)
    }

    /// True when `key` holds a value.
    fn exists(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let store = self.store(py)?;
        let key = key_of(py, key)?;
        py.detach(|| store.block_on(store.exists(&key))).py(py)
    }

    /// The keys that start with `prefix` and hold a value, sorted.
    #[pyo3(signature = (prefix=None))]
    fn list<'py>(
        &self,
        py: Python<'py>,
        prefix: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let store = self.store(py)?;
        let prefix = match prefix {
            Some(p) => key_of(py, p)?,
            None => Vec::new(),
        };
        let keys = py.detach(|| store.block_on(store.list(&prefix))).py(py)?;
        Ok(keys.iter().map(|k| PyBytes::new(py, k)).collect())
    }

    /// Registers `buffer` (any object with the buffer protocol, C-contiguous) with this
    /// client, for the zero-copy calls.
    fn register(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<RegisteredBuffer> {
        let store = self.store(py)?;
        RegisteredBuffer::register(py, store.pool().pd(), self.owner, buffer)
    }

    /// Stores the bytes of the registered `view` under `key`, WRITten from its memory with
    /// no copy; returns the version. The bytes must not change until it returns. With `ttl`
    /// (seconds) and `pin`, as `put`.
    #[pyo3(signature = (key, view, ttl=None, pin=None))]
    fn put_from<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        view: PyRef<'py, RegisteredBuffer>,
        ttl: Option<&Bound<'py, PyAny>>,
        pin: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let store = self.store(py)?;
        let key = key_of(py, key)?;
        let options = PutOptions {
            ttl: ttl_of(py, ttl)?,
            pin: pin_of(py, pin)?,
        };
        let mr = view.shared(py, self.owner)?;
        let v = py
            .detach(|| store.block_on(store.put_from_with_options(&key, &mr, options)))
            .py(py)?;
        self.zero_copy
            .fetch_add(view.len() as u64, Ordering::Relaxed);
        version(py, v)
    }

    /// Reads the value of `key` into the registered, writable `view` from its start, with
    /// no copy: its length, or `None` when the key holds no value. Raises `OutOfLimits` when
    /// the value is longer than the view.
    fn get_into(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        view: PyRef<'_, RegisteredBuffer>,
    ) -> PyResult<Option<usize>> {
        let store = self.store(py)?;
        let key = key_of(py, key)?;
        let mr = view.writable(py, self.owner, "get_into")?;
        let n = py
            .detach(|| store.block_on(store.get_into(&key, &mr)))
            .py(py)?;
        self.zero_copy
            .fetch_add(n.unwrap_or(0) as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// `put_from` of every key from its view, together (`Store::put_from_many`: every round
    /// of the puts goes out at once, one list per server): the versions, in order; a key
    /// given twice ends with its last view's bytes. Raises `BatchError` (with every key's
    /// outcome in `.results`) when any key fails.
    fn batch_put_from<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        views: Vec<PyRef<'py, RegisteredBuffer>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let store = self.store(py)?;
        let (keys, mrs) = self.pairs(py, "batch_put_from", keys, &views, false)?;
        let results = py.detach(|| {
            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let values: Vec<&Mr<Shared>> = mrs.iter().collect();
            store.block_on(store.put_from_many(&keys, &values))
        });
        let moved: usize = views
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(v, _)| v.len())
            .sum();
        self.zero_copy.fetch_add(moved as u64, Ordering::Relaxed);
        batch(py, "batch_put_from", results, version)
    }

    /// `get_into` of every key into its view: each value's length, or `None` for a key
    /// with no value. Keys this client saw lately take one round together (per server,
    /// one list); the others are looked up at once. Raises `BatchError` when any key fails.
    fn batch_get_into<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        views: Vec<PyRef<'py, RegisteredBuffer>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let store = self.store(py)?;
        let (keys, mrs) = self.pairs(py, "batch_get_into", keys, &views, true)?;
        let results = py.detach(|| {
            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let outs: Vec<&Mr<Shared>> = mrs.iter().collect();
            store.block_on(store.get_into_many(&keys, &outs))
        });
        let moved: usize = results.iter().filter_map(|r| *r.as_ref().ok()?).sum();
        self.zero_copy.fetch_add(moved as u64, Ordering::Relaxed);
        batch(py, "batch_get_into", results, |py, n: Option<usize>| {
            Ok(n.into_pyobject(py)?.into_any())
        })
    }

    /// `exists` of every key, looked up together in rounds of one list per server (each
    /// key's block read and verified, as `exists` does). Raises `BatchError` when any key
    /// fails.
    fn batch_exists<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let store = self.store(py)?;
        let keys = keys_of(py, keys)?;
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let results = py.detach(|| store.block_on(store.exists_many(&refs)));
        batch(py, "batch_exists", results, |py, b: bool| {
            Ok(pyo3::types::PyBool::new(py, b).to_owned().into_any())
        })
    }

    /// `remove` of every key, together (`Store::remove_many`: every round of the removes
    /// goes out at once, one list per server): whether each removed a value. A key given
    /// twice is removed once. Raises `BatchError` when any key fails.
    fn remove_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let store = self.store(py)?;
        let keys = keys_of(py, keys)?;
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let results = py.detach(|| store.block_on(store.remove_many(&refs)));
        batch(py, "remove_many", results, |py, b: bool| {
            Ok(pyo3::types::PyBool::new(py, b).to_owned().into_any())
        })
    }

    /// The values of `keys` (bytes, or `None` for a key with none), read together in
    /// rounds of one list per server. Raises `BatchError` when any key fails.
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let store = self.store(py)?;
        let keys = keys_of(py, keys)?;
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let results = py.detach(|| store.block_on(store.get_many(&refs)));
        let copied: usize = results
            .iter()
            .filter_map(|r| r.as_ref().ok()?.as_ref().map(Vec::len))
            .sum();
        self.copied.fetch_add(copied as u64, Ordering::Relaxed);
        batch(py, "get_many", results, |py, v: Option<Vec<u8>>| {
            Ok(match v {
                Some(v) => PyBytes::new(py, &v).into_any(),
                None => py.None().into_bound(py),
            })
        })
    }

    /// `put` of every key with its value, together (`Store::put_many`: every round of the
    /// puts goes out at once, one list per server): the versions; a key given twice ends
    /// with its last value. Raises `BatchError` when any key fails.
    fn put_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let store = self.store(py)?;
        let keys = keys_of(py, keys)?;
        let values = values
            .try_iter()?
            .map(|v| copy_of(&v?))
            .collect::<PyResult<Vec<Vec<u8>>>>()?;
        if keys.len() != values.len() {
            return Err(bad_arg(
                py,
                format!("put_many: {} keys but {} values", keys.len(), values.len()),
            ));
        }
        let copied: usize = values.iter().map(Vec::len).sum();
        self.copied.fetch_add(copied as u64, Ordering::Relaxed);
        let results = py.detach(|| {
            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let values: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            store.block_on(store.put_many(&keys, &values))
        });
        batch(py, "put_many", results, version)
    }

    /// Copies every replica of every key to where the current servers want it, and frees
    /// what gone writers left (docs/STORE.md section 7): the report, as a dict.
    fn repair<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let store = self.store(py)?;
        let r = py.detach(|| store.block_on(store.repair())).py(py)?;
        let d = PyDict::new(py);
        d.set_item("nodes", r.nodes)?;
        d.set_item("keys", r.keys)?;
        d.set_item("copied", r.copied)?;
        d.set_item("expired", r.expired)?;
        d.set_item("cleared", r.cleared)?;
        d.set_item("unreadable", r.unreadable)?;
        d.set_item("failed", r.failed)?;
        d.set_item("deferred", r.deferred)?;
        d.set_item("conflicts", r.conflicts)?;
        d.set_item("reclaimed", r.reclaimed)?;
        d.set_item("released", r.released)?;
        d.set_item("tombstones_cleared", r.tombstones_cleared)?;
        Ok(d)
    }

    /// Each live server's usage in a cache (docs/STORE.md 12): a list of dicts with
    /// `node`, `used` (bytes its index names) and `budget` (0 outside cache mode).
    fn server_usage<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let store = self.store(py)?;
        let usage = py.detach(|| store.block_on(store.server_usage())).py(py)?;
        usage
            .iter()
            .map(|u| {
                let d = PyDict::new(py);
                d.set_item("node", u.node)?;
                d.set_item("used", u.used)?;
                d.set_item("budget", u.budget)?;
                Ok(d)
            })
            .collect()
    }

    /// Each live server's counters and usage (docs/STORE.md section 2), from one READ of
    /// its index chunk: a list of dicts with `node`, `used`, `budget`, `hits`, `misses`,
    /// `evictions` and `expirations`, as every client added them (this one's counts not
    /// yet added are not in them: `flush_counters()` first).
    fn server_stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let store = self.store(py)?;
        let stats = py.detach(|| store.block_on(store.server_stats())).py(py)?;
        stats
            .iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("node", s.node)?;
                d.set_item("used", s.used)?;
                d.set_item("budget", s.budget)?;
                d.set_item("hits", s.hits)?;
                d.set_item("misses", s.misses)?;
                d.set_item("evictions", s.evictions)?;
                d.set_item("expirations", s.expirations)?;
                Ok(d)
            })
            .collect()
    }

    /// Adds what this client counted to the servers' counters now (`Store::flush_counters`;
    /// `close()` does too).
    fn flush_counters(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.store(py)?;
        py.detach(|| store.block_on(store.flush_counters()));
        Ok(())
    }

    /// This client's counters, as a dict (`StoreStats`, and what the binding copied).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.store(py)?.stats();
        let d = PyDict::new(py);
        d.set_item("puts", s.puts)?;
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("removes", s.removes)?;
        d.set_item("retired", s.retired)?;
        d.set_item("freed", s.freed)?;
        d.set_item("waits_for_room", s.waits_for_room)?;
        d.set_item("fenced", s.fenced)?;
        d.set_item("put_round_trips", s.put_round_trips)?;
        d.set_item("get_round_trips", s.get_round_trips)?;
        d.set_item("expired", s.expired)?;
        d.set_item("reclaimed", s.reclaimed)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("access_updates", s.access_updates)?;
        d.set_item("bytes_copied", self.copied.load(Ordering::Relaxed))?;
        d.set_item("bytes_zero_copy", self.zero_copy.load(Ordering::Relaxed))?;
        Ok(d)
    }

    /// Adds what this client counted to the servers' counters and frees the blocks it
    /// replaced once their grace period is over, then closes the client: later calls
    /// raise, and its client id is free again once calls under way in other threads end.
    /// Idempotent.
    fn close(&self, py: Python<'_>) {
        let taken = self.store.write().take();
        if let Some(store) = taken {
            py.detach(move || {
                store.block_on(store.flush_counters());
                store.block_on(store.flush_retired());
                drop(store);
            });
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }
}

/// A copy of the bytes of `value` (bytes, bytearray, memoryview, or any C-contiguous
/// buffer).
pub fn copy_of(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = value.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    let buf = pyo3::buffer::PyBuffer::<u8>::get(value).or_else(|_| {
        // Any other element type: its bytes, through a byte-format memoryview.
        let mv = value
            .py()
            .import("builtins")?
            .getattr("memoryview")?
            .call1((value,))?
            .call_method1("cast", ("B",))?;
        pyo3::buffer::PyBuffer::<u8>::get(&mv)
    })?;
    buf.to_vec(value.py())
}

/// A time to live given in seconds (an int or a float, finite and above 0), or none.
/// A `pin` argument: None, "hard" or "soft".
fn pin_of(py: Python<'_>, pin: Option<&str>) -> PyResult<Pin> {
    match pin {
        None => Ok(Pin::None),
        Some("hard") => Ok(Pin::Hard),
        Some("soft") => Ok(Pin::Soft),
        Some(other) => Err(bad_arg(
            py,
            format!("pin: {other:?}; None, \"hard\" or \"soft\""),
        )),
    }
}

fn ttl_of(py: Python<'_>, ttl: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let Some(ttl) = ttl.filter(|t| !t.is_none()) else {
        return Ok(None);
    };
    let secs: f64 = ttl
        .extract()
        .map_err(|_| bad_arg(py, "ttl: seconds, an int or a float"))?;
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if !d.is_zero() => Ok(Some(d)),
        _ => Err(bad_arg(
            py,
            format!("ttl: {secs} seconds; a time to live is a finite number of seconds above 0"),
        )),
    }
}
