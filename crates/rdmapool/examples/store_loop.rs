//! A fixed number of 64-byte puts and gets of the object store on three memory servers in
//! this process (two replicas, the soft provider's intra-host path, caller-driven
//! progress). Meant for instruction counts, which are repeatable on a noisy machine: the
//! difference between two counts of `N` and `2N` rounds is the cost of `N` put+get pairs
//! (docs/BENCHMARKS.md).
//!
//! ```sh
//! cargo build --release -p rdmapool --example store_loop
//! valgrind --tool=callgrind target/release/examples/store_loop 2000
//! valgrind --tool=callgrind target/release/examples/store_loop 4000
//! ```

use rdmapool::fabric::*;
use rdmapool::remote::*;
use rdmapool::store::{Store, StoreConfig};

fn main() -> rdmapool::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let ctx = Context::open(SoftConfig::from_env()?.with_transport(Transport::Local))?;
    let cfg = |node| ServerConfig {
        node,
        size: 16 << 20,
        chunk_size: 1 << 20,
        ..ServerConfig::default()
    };
    let servers = [
        MemoryServer::start(&ctx, cfg(1))?,
        MemoryServer::start(&ctx, cfg(2))?,
        MemoryServer::start(&ctx, cfg(3))?,
    ];
    let members = StaticMembership::new(servers.iter().map(MemoryServer::addr).collect());
    let pd = ctx.alloc_pd()?;
    let pool = PoolClient::connect(&ctx, &pd, &members, ClientConfig::new(7))?;
    // No frees during the run (they come after the grace period, by the clock, which would
    // make the count depend on how fast the run went).
    let store = Store::new(
        pool,
        StoreConfig {
            grace: std::time::Duration::from_secs(3600),
            ..StoreConfig::default()
        },
    )?;
    let keys: Vec<String> = (0..64).map(|i| format!("key-{i}")).collect();
    let value = [0x5au8; 64];
    // Every key once first, so that the rounds measured overwrite (the steady state).
    for k in &keys {
        store.block_on(store.put(k.as_bytes(), &value))?;
    }
    let mut found = 0;
    for i in 0..n {
        let k = keys[i % keys.len()].as_bytes();
        store.block_on(store.put(k, &value))?;
        found += usize::from(store.block_on(store.get(k))?.is_some());
    }
    assert_eq!(found, n, "every get finds its put");
    println!("{n} put+get pairs");
    Ok(())
}
