//! A tiny distributed key-value store on the remote memory pool: three memory servers, one
//! client. Values live in remote memory placed by a hash of their key; each record is a
//! version word (bumped with compare-and-swap, so concurrent writers cannot both win), a
//! length and the bytes. The servers' CPUs do nothing: every step is one-sided.
//!
//! ```sh
//! cargo run --release -p rdmapool --example pool_kv
//! ```

use rdmapool::fabric::*;
use rdmapool::remote::*;
use std::collections::HashMap;
use std::sync::Arc;

const RECORD: u64 = 256; // version (8) + length (8) + up to 240 bytes

struct Kv {
    pool: PoolClient,
    index: HashMap<String, RemotePtr>,
    buf: Arc<Mr>,
}

fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl Kv {
    /// Writes `value` under `key`: a new record, or the next version of the old one.
    fn put(&mut self, key: &str, value: &[u8]) -> rdmapool::Result<u64> {
        assert!(
            value.len() as u64 <= RECORD - 16,
            "value too long for this demo"
        );
        let pool = &self.pool;
        let ptr = match self.index.get(key) {
            Some(p) => *p,
            None => {
                let p = pool.block_on(pool.alloc(RECORD, Some(key_hash(key))))?;
                self.index.insert(key.to_string(), p);
                p
            }
        };
        // Claim the next version: odd while the bytes are being written.
        let v = pool.block_on(pool.fetch_and_add(ptr, 0, 0))?;
        let claimed = pool.block_on(pool.compare_and_swap(ptr, 0, v, v + 1))?;
        assert_eq!(claimed, v, "a concurrent writer (none in this demo)");
        self.buf.write_at(0, &(value.len() as u64).to_ne_bytes())?;
        self.buf.write_at(8, value)?;
        let (r, _) = pool.block_on(pool.write(ptr, 8, self.buf.clone(), 0, 8 + value.len() as u32));
        r?;
        pool.block_on(pool.compare_and_swap(ptr, 0, v + 1, v + 2))?;
        Ok((v + 2) / 2)
    }

    /// The value under `key` and its version, read in one READ (retried while a write is
    /// in progress).
    fn get(&self, key: &str) -> rdmapool::Result<Option<(Vec<u8>, u64)>> {
        let Some(&ptr) = self.index.get(key) else {
            return Ok(None);
        };
        loop {
            let (r, buf) =
                self.pool.block_on(
                    self.pool
                        .read(ptr, 0, self.buf.clone(), 1024, RECORD as u32),
                );
            r?;
            let version = buf.read_u64(1024)?;
            if version % 2 == 1 {
                continue; // a writer is mid-update
            }
            let len = buf.read_u64(1032)? as usize;
            let mut value = vec![0u8; len];
            buf.read_at(1040, &mut value)?;
            return Ok(Some((value, version / 2)));
        }
    }

    fn delete(&mut self, key: &str) -> rdmapool::Result<bool> {
        match self.index.remove(key) {
            Some(p) => self.pool.block_on(self.pool.free(p)).map(|_| true),
            None => Ok(false),
        }
    }
}

fn main() -> rdmapool::Result<()> {
    let ctx = Context::open(SoftConfig::from_env()?)?;
    let servers: Vec<MemoryServer> = (1..=3)
        .map(|node| {
            MemoryServer::start(
                &ctx,
                ServerConfig {
                    node,
                    // 2 MiB each: the three stay inside an ordinary account's 8 MiB
                    // locked-memory limit (the region is pinned).
                    size: 2 << 20,
                    chunk_size: 128 << 10,
                    ..ServerConfig::default()
                },
            )
        })
        .collect::<rdmapool::Result<_>>()?;
    let members = StaticMembership::new(servers.iter().map(|s| s.addr()).collect());
    let pd = ctx.alloc_pd()?;
    let cfg = ClientConfig {
        placement: Box::new(KeyHash::default()),
        ..ClientConfig::new(1)
    };
    let pool = PoolClient::connect(&ctx, &pd, &members, cfg)?;
    let buf = Arc::new(pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?);
    let mut kv = Kv {
        pool,
        index: HashMap::new(),
        buf,
    };

    let fruit = [
        "apple", "banana", "cherry", "damson", "elder", "fig", "grape",
    ];
    for (i, k) in fruit.iter().enumerate() {
        kv.put(k, format!("{k} #{i}").as_bytes())?;
    }
    assert_eq!(kv.put("apple", b"green apple")?, 2, "second version");
    for k in fruit {
        let (v, version) = kv.get(k)?.expect("stored");
        let node = kv.index[k].node;
        println!(
            "{k:>7} -> {:<14} v{version} on node {node}",
            String::from_utf8_lossy(&v)
        );
    }
    assert_eq!(kv.get("apple")?.unwrap().0, b"green apple");
    let nodes: std::collections::HashSet<u32> = kv.index.values().map(|p| p.node).collect();
    assert!(nodes.len() > 1, "keys spread over the servers: {nodes:?}");
    assert!(kv.delete("fig")?);
    assert_eq!(kv.get("fig")?, None);
    for s in &servers {
        assert_eq!(
            s.stats().requests_handled,
            0,
            "a server's CPU handled a request"
        );
    }
    println!(
        "pool_kv: {} keys on {} nodes; the servers handled 0 requests",
        kv.index.len(),
        nodes.len()
    );
    Ok(())
}
