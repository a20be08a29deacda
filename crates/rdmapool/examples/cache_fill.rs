//! Puts into a full cache (docs/STORE.md section 12): `N` puts (default 1 000 000) of
//! 900-byte values, keys drawn at random from a key space ten times what the cache holds,
//! into three memory servers in this process (two replicas, the soft provider's intra-host
//! path). Prints the puts that failed (the goal: none), the evictions, the send work
//! requests (RDMA operations) per put and the time per put, beside the same puts into a
//! durable store large enough for every key (the cost of eviction is the difference), and
//! the hit rate of a read of every key at the end.
//!
//! ```sh
//! cargo run --release -p rdmapool --example cache_fill            # 1 000 000 puts
//! cargo run --release -p rdmapool --example cache_fill -- 100000  # fewer
//! ```

use rdmapool::fabric::*;
use rdmapool::remote::*;
use rdmapool::store::{CacheConfig, Store, StoreConfig};
use std::time::{Duration, Instant};

/// Keys in the key space.
const KEYS: usize = 60_000;
/// Bytes of each value: with its header and key, a block of the 1 KiB class.
const VALUE: usize = 900;

/// What one run did.
struct Run {
    failed: usize,
    evictions: u64,
    sends_per_put: f64,
    micros_per_put: f64,
    hit_rate: f64,
}

fn run(puts: usize, budget: Option<u64>, region: usize) -> rdmapool::Result<Run> {
    let ctx = Context::open(SoftConfig::from_env()?.with_transport(Transport::Local))?;
    let cfg = |node| ServerConfig {
        node,
        size: region,
        // 4 MiB chunks: an index of 64k buckets, so no bucket of the durable store's 40k
        // keys per server runs out of its 8 slots.
        chunk_size: 4 << 20,
        ..ServerConfig::default()
    };
    let servers = [
        MemoryServer::start(&ctx, cfg(1))?,
        MemoryServer::start(&ctx, cfg(2))?,
        MemoryServer::start(&ctx, cfg(3))?,
    ];
    let members = StaticMembership::new(servers.iter().map(MemoryServer::addr).collect());
    // The client in a context of its own: its recorder counts its sends alone.
    let client_ctx = Context::open(SoftConfig::from_env()?.with_transport(Transport::Local))?;
    let pd = client_ctx.alloc_pd()?;
    let pool = PoolClient::connect(&client_ctx, &pd, &members, ClientConfig::new(7))?;
    let store = Store::new(
        pool,
        StoreConfig {
            grace: Duration::from_millis(100),
            cache: budget.map(CacheConfig::new),
            ..StoreConfig::default()
        },
    )?;
    let value = vec![0x5au8; VALUE];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let sends = || pd.recorder().snapshot().sends_posted;
    let (sends_before, started) = (sends(), Instant::now());
    let mut failed = 0;
    for _ in 0..puts {
        let key = format!("key-{}", next() % KEYS as u64);
        if let Err(e) = store.block_on(store.put(key.as_bytes(), &value)) {
            failed += 1;
            if failed <= 5 {
                eprintln!("a put failed: {e}");
            }
        }
    }
    let elapsed = started.elapsed();
    let sent = sends() - sends_before;
    let mut hits = 0;
    for k in 0..KEYS {
        let got = store.block_on(store.get(format!("key-{k}").as_bytes()))?;
        hits += usize::from(got.is_some());
    }
    Ok(Run {
        failed,
        evictions: store.stats().evictions,
        sends_per_put: sent as f64 / puts as f64,
        micros_per_put: elapsed.as_secs_f64() * 1e6 / puts as f64,
        hit_rate: hits as f64 / KEYS as f64,
    })
}

fn main() -> rdmapool::Result<()> {
    let puts: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    // Every key's blocks: 1 KiB each, two replicas over three servers, per server.
    let data_per_server = (KEYS * 1024 * 2 / 3) as u64;
    let budget = data_per_server / 10;
    let cache = run(puts, Some(budget), 64 << 20)?;
    let durable = run(puts, None, 128 << 20)?;
    println!(
        "{puts} puts of {VALUE} B over {KEYS} keys; cache of {} KiB per server (a tenth of \
         the {} KiB of blocks per server)",
        budget >> 10,
        data_per_server >> 10
    );
    for (name, r) in [("cache", &cache), ("durable", &durable)] {
        println!(
            "{name:8} failed {:>3}  evictions {:>8}  sends/put {:6.2}  µs/put {:6.2}  hit rate {:.3}",
            r.failed, r.evictions, r.sends_per_put, r.micros_per_put, r.hit_rate
        );
    }
    println!(
        "eviction cost: {:+.2} sends per put, {:+.2} µs per put",
        cache.sends_per_put - durable.sends_per_put,
        cache.micros_per_put - durable.micros_per_put
    );
    Ok(())
}
