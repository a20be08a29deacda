//! The workload `monitor` runs when given no `--target`: on the device of `--provider`/`--device`, a background
//! thread registers and deregisters regions of a few sizes through a registrar, looks
//! buffers up in a registration cache and takes buffers from a pool, so every metric the
//! monitor shows has real numbers behind it (from this process's registry).

use crate::device_args::DeviceArgs;
use crate::Result;
use rdmapool::buf::{BufferPool, PoolConfig};
use rdmapool::fabric::{AccessFlags, Transport};
use rdmapool::mr::{CacheConfig, RegCache, Registrar, RegistrarConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The running probe; dropping it stops the thread.
pub struct Probe {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Probe {
    /// Sets up the objects (errors are reported here) and starts the thread.
    pub fn start(device: &DeviceArgs) -> Result<Self> {
        let pd = device.open(Transport::Auto)?.alloc_pd()?;
        let reg = Registrar::new(pd.clone(), RegistrarConfig::default())?;
        let cache = RegCache::new(pd.clone(), CacheConfig::default())?;
        let pool = BufferPool::new(pd, PoolConfig::default())?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("monitor-probe".into())
            .spawn(move || work(&reg, cache, &pool, &s))
            .map_err(|e| crate::ToolError::Io("starting the probe thread".into(), e))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn work(reg: &Registrar, cache: RegCache, pool: &BufferPool, stop: &AtomicBool) {
    const SIZES: [usize; 4] = [64 << 10, 256 << 10, 1 << 20, 4 << 20];
    // Eight buffers looked up in the cache in turn: misses at first, hits after.
    let bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 64 << 10]).collect();
    let mut held = std::collections::VecDeque::new();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let len = SIZES[i % SIZES.len()];
        if let Ok(mr) = reg.submit(len, AccessFlags::LOCAL_WRITE).wait() {
            drop(mr); // deregisters
        }
        let b = &bufs[i % bufs.len()];
        // SAFETY: `bufs` outlives the cache (dropped explicitly below, before `bufs`), and
        // the handle is dropped at once.
        drop(unsafe { cache.get(b.as_ptr(), b.len()) });
        // A few buffers held at a time (the oldest returned), so usage is never idle.
        if let Ok(b) = pool.alloc(4096 << (i % 3)) {
            held.push_back(b);
        }
        if held.len() > 3 {
            held.pop_front();
        }
        std::thread::sleep(Duration::from_millis(10));
        i += 1;
    }
    drop(cache); // its registrations go before the memory they cover
    drop(bufs);
}
