//! The library calls behind `rdma-tool stress` and `bench reg`: registering memory through
//! the asynchronous registrar (pooled memory registered and deregistered every round, then
//! many requests in flight at once), the registration cache answering repeated lookups
//! without registering, and a pre-registered buffer pool that never registers on `alloc`.
//! The figures come from the process-wide metrics registry (`rdmapool::metrics::snapshot`),
//! which is what `rdma-tool monitor` reads from a running process.
//!
//! ```sh
//! cargo run --release -p rdmapool --example registration
//! ```

use rdmapool::buf::{BufferPool, PoolConfig};
use rdmapool::fabric::SoftConfig;
use rdmapool::fabric::{AccessFlags, Context};
use rdmapool::mr::{CacheConfig, RegCache, Registrar, RegistrarConfig};

const ROUNDS: usize = 50;
const REGION: usize = 1 << 20;
/// Regions registered at once. Each pins 1 MiB and a page (a soft region's control page), so
/// eight would not fit an ordinary account's 8 MiB memlock limit; six leave room.
const IN_FLIGHT: usize = 6;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::open(SoftConfig::from_env()?)?;
    let pd = ctx.alloc_pd()?;
    let metrics = ctx.metrics(); // what this context's registrations did

    // 1. Pooled memory: allocated once, registered and deregistered every round, as a
    //    service that keeps its buffers does (what `stress` measures by default).
    let registrar = Registrar::new(pd.clone(), RegistrarConfig::default())?;
    let mut buf = vec![0u8; REGION];
    for _ in 0..ROUNDS {
        let registered = registrar
            .submit_owned(buf, AccessFlags::LOCAL_WRITE)
            .wait()
            .map_err(|e| e.error)?;
        buf = registered.into_inner(); // deregisters and gives the memory back
    }

    // 2. Many requests in flight: submitting returns at once; the workers register.
    let handles: Vec<_> = (0..IN_FLIGHT)
        .map(|_| registrar.submit(REGION, AccessFlags::LOCAL_WRITE))
        .collect();
    let regions = handles
        .iter()
        .map(|h| h.wait())
        .collect::<Result<Vec<_>, _>>()?;
    println!("{} regions registered concurrently", regions.len());
    drop(regions);

    // 3. The cache: the first lookup of a buffer registers it, the others are hits.
    let cache = RegCache::new(pd.clone(), CacheConfig::default())?;
    let data = vec![0u8; 64 << 10];
    for _ in 0..ROUNDS {
        // SAFETY: `data` is neither freed nor moved before `cache` is dropped (below), and
        // each handle is dropped at once.
        let hit = unsafe { cache.get(data.as_ptr(), data.len()) }?;
        drop(hit);
    }
    drop(cache);
    drop(data);

    // 4. The pool: chunks registered up front, buffers handed out without a registration.
    let pool = BufferPool::new(pd, PoolConfig::default())?;
    let before = metrics.snapshot().registrations;
    for _ in 0..ROUNDS {
        let b = pool.alloc(4096)?;
        drop(b);
    }
    let during = metrics.snapshot().registrations - before;

    let s = metrics.snapshot();
    let reg = &s.registration_latency;
    let dereg = &s.deregistration_latency;
    println!(
        "registrations: {} ({} errors), latency p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        s.registrations,
        s.registration_errors,
        reg.percentile_us(50.0).unwrap_or(0.0),
        reg.percentile_us(99.0).unwrap_or(0.0),
        reg.percentile_us(100.0).unwrap_or(0.0),
    );
    println!(
        "deregistrations: {}, latency p50 {:.1} us, p99 {:.1} us",
        s.deregistrations,
        dereg.percentile_us(50.0).unwrap_or(0.0),
        dereg.percentile_us(99.0).unwrap_or(0.0),
    );
    println!(
        "cache: {} hits, {} misses; pool: {} buffers handed out, {} registrations meanwhile",
        s.cache_hits, s.cache_misses, s.pool_allocations, during
    );
    let hits = s.cache_hits;
    if hits != ROUNDS as u64 - 1 || during != 0 {
        return Err(format!(
            "expected {} cache hits and no pool registration",
            ROUNDS - 1
        )
        .into());
    }
    Ok(())
}
