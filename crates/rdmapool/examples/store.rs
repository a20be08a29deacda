//! The replicated object store on three memory servers (docs/STORE.md): put, get and remove
//! by key with two replicas of every object, all one-sided (the servers' CPUs handle no
//! request). A second client reads what the first wrote, a server is stopped, every object
//! is still read from its other replica, and once the server is taken out of the
//! membership a repair brings each back to two replicas on the servers left. The example
//! checks each thing it reads.
//!
//! ```sh
//! cargo run --release -p rdmapool --example store
//! ```

use rdmapool::fabric::*;
use rdmapool::remote::*;
use rdmapool::store::{Store, StoreConfig};
use std::time::{Duration, Instant};

fn server(ctx: &Context, node: u32) -> rdmapool::Result<MemoryServer> {
    MemoryServer::start(
        ctx,
        ServerConfig {
            node,
            size: 16 << 20,
            chunk_size: 1 << 20,
            ..ServerConfig::default()
        },
    )
}

fn client(ctx: &Context, servers: &[&MemoryServer], id: u64) -> rdmapool::Result<Store> {
    let pd = ctx.alloc_pd()?;
    let members = StaticMembership::new(servers.iter().map(|s| s.addr()).collect());
    let pool = PoolClient::connect(ctx, &pd, &members, ClientConfig::new(id))?;
    Store::new(pool, StoreConfig::default()) // two replicas per object
}

fn value_of(i: usize) -> Vec<u8> {
    format!("value {i}: {}", "*".repeat(i % 50)).into_bytes()
}

fn main() -> rdmapool::Result<()> {
    let ctx = Context::open(SoftConfig::default())?;
    let mut servers: Vec<Option<MemoryServer>> = Vec::new();
    for node in 1..=3 {
        servers.push(Some(server(&ctx, node)?));
    }
    let all: Vec<&MemoryServer> = servers.iter().flatten().collect();
    let writer = client(&ctx, &all, 1)?;
    let reader = client(&ctx, &all, 2)?;

    // Put 100 objects; each lands on the two servers its key ranks highest.
    for i in 0..100 {
        let key = format!("user:{i}");
        writer.block_on(writer.put(key.as_bytes(), &value_of(i)))?;
    }
    // Another client reads them, and overwrites one: a new version.
    for i in 0..100 {
        let key = format!("user:{i}");
        let got = reader.block_on(reader.get(key.as_bytes()))?;
        assert_eq!(got, Some(value_of(i)), "{key}");
    }
    let v = reader.block_on(reader.put(b"user:7", b"rewritten"))?;
    assert_eq!(v.seq, 2, "the second version of user:7");
    assert!(writer.block_on(writer.remove(b"user:8"))?);
    assert_eq!(reader.block_on(reader.get(b"user:8"))?, None);
    let where_ = reader.block_on(reader.locate(b"user:9"))?;
    let nodes: Vec<u32> = where_.iter().map(|l| l.block.node).collect();
    println!("user:9 is on nodes {nodes:?}");
    let handled: u64 = all.iter().map(|s| s.stats().requests_handled).sum();
    assert_eq!(handled, 0, "the servers' CPUs took no part");

    // Stop one server: every object still has a replica.
    drop(all);
    drop(servers[1].take());
    let until = Instant::now() + Duration::from_secs(20);
    let mut read = 0;
    for i in (0..100).filter(|&i| i != 8) {
        let key = format!("user:{i}");
        let want = if i == 7 {
            b"rewritten".to_vec()
        } else {
            value_of(i)
        };
        loop {
            // The first call that meets the stopped server learns it is down.
            match reader.block_on(reader.get(key.as_bytes())) {
                Ok(got) => {
                    assert_eq!(got, Some(want), "{key} after the loss of node 2");
                    read += 1;
                    break;
                }
                Err(rdmapool::Error::NodeDown { .. }) if Instant::now() < until => continue,
                Err(e) => return Err(e),
            }
        }
    }
    // Node 2 stays a member, and so a replica of its keys, until the membership changes:
    // its keys' puts are refused meanwhile, and a repair copies but clears nothing there.
    // It is gone for good: take it out (with etcd its key would go by itself), then
    // repair: every object back to two replicas, on the two servers left.
    reader.pool().remove_server(2);
    let r = reader.block_on(reader.repair())?;
    assert_eq!((r.failed, r.unreadable), (0, 0));
    for i in (0..100).filter(|&i| i != 8) {
        let copies = reader.block_on(reader.locate(format!("user:{i}").as_bytes()))?;
        assert_eq!(copies.len(), 2, "user:{i} has two replicas again");
    }
    let stats = reader.stats();
    println!(
        "store: 100 objects on 3 servers, 2 replicas each; {read} read back after node 2 \
         stopped, {} replicas copied by a repair; reader: {} hits, {} misses",
        r.copied, stats.hits, stats.misses
    );
    Ok(())
}
