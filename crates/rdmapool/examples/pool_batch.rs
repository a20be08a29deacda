//! 8-byte FAAs through the memory pool on the soft provider (one server and one client in
//! this process, the server's memory mapped intra-host): `single` awaits one
//! `fetch_and_add` at a time, `batch` runs them in pool batches of 32 (one list, one
//! completion each), and `alloc` allocates 64 bytes and frees them, one pair at a time.
//! Meant for instruction counts per operation, which are repeatable on a noisy machine:
//! run two counts and take the difference.
//!
//! ```sh
//! cargo build --release -p rdmapool --example pool_batch
//! valgrind --tool=callgrind target/release/examples/pool_batch batch 3200
//! valgrind --tool=callgrind target/release/examples/pool_batch batch 6400
//! ```

use rdmapool::fabric::*;
use rdmapool::remote::*;
use std::net::SocketAddr;

fn main() -> rdmapool::Result<()> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "batch".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(32_000);
    let server_ctx = Context::open(SoftConfig::from_env()?)?;
    let server = MemoryServer::start(
        &server_ctx,
        ServerConfig {
            size: 8 << 20,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..ServerConfig::default()
        },
    )?;
    let ctx = Context::open(SoftConfig::from_env()?)?;
    let pd = ctx.alloc_pd()?;
    let members = StaticMembership::new(vec![server.addr()]);
    let client = PoolClient::connect(&ctx, &pd, &members, ClientConfig::new(7))?;
    let ptr = client.block_on(client.alloc(64, None))?;
    let t = std::time::Instant::now();
    if mode == "alloc" {
        for _ in 0..n {
            let p = client.block_on(client.alloc(64, None))?;
            client.block_on(client.free(p))?;
        }
        println!("alloc: {n} pairs, {:?} each", t.elapsed() / n.max(1) as u32);
        return Ok(());
    }
    if mode == "single" {
        for _ in 0..n {
            client.block_on(client.fetch_and_add(ptr, 0, 1))?;
        }
    } else {
        for _ in 0..n / 32 {
            let mut batch = client.batch::<Mr<Shared>>();
            for _ in 0..32 {
                batch.fetch_and_add(ptr, 0, 1);
            }
            for o in client.block_on(batch.run()) {
                o.result?;
            }
        }
    }
    let total = client.block_on(client.fetch_and_add(ptr, 0, 0))?;
    println!(
        "{mode}: {total} FAAs, {:?} each",
        t.elapsed() / total.max(1) as u32
    );
    Ok(())
}
