//! The async API on tokio with event-driven progress: two soft NICs in one process, a QP
//! pair, then concurrent WRITEs, a READ into a pooled buffer and one into a safely registered
//! `Vec<u8>` (each buffer comes back with the outcome), and a batch of fetch-and-adds with
//! one doorbell, each checked.
//!
//! ```sh
//! cargo run --release -p rdmapool --example async_tokio
//! ```

use rdmapool::buf::{BufferPool, PoolConfig};
use rdmapool::cq::{CqPool, Engine, EngineConfig, Progress};
use rdmapool::fabric::*;
use std::sync::Arc;

#[tokio::main(flavor = "current_thread")]
async fn main() -> rdmapool::Result<()> {
    let (here, there) = (
        Context::open(SoftConfig::from_env()?)?,
        Context::open(SoftConfig::from_env()?)?,
    );
    let (pd, remote_pd) = (here.alloc_pd()?, there.alloc_pd()?);
    // Two CQs; the engine waits on their completion channels through tokio.
    let pool = CqPool::new(&here, 2, 1024)?;
    let engine = Engine::with_pool(
        pool,
        EngineConfig {
            progress: Progress::Event,
            ..EngineConfig::default()
        },
    )?;
    let cfg = QpConfig::default();
    let qp = engine.create_qp(&pd, &cfg)?;
    let remote_cq = there.create_cq(1024)?;
    let peer = remote_pd.create_qp(&remote_cq, &remote_cq, &cfg)?;
    qp.connect(&peer.endpoint())?;
    peer.connect(&qp.qp().endpoint())?;

    // The memory the other side exports, and ours.
    let target = remote_pd.alloc_mr(1 << 16, AccessFlags::all_remote())?;
    let local = Arc::new(pd.alloc_mr(1 << 16, AccessFlags::all_remote())?);
    for i in 0..16 {
        local.write_at(i * 4096, &[i as u8; 4096])?;
    }

    // Sixteen WRITEs in flight at once.
    let writes: Vec<_> = (0..16)
        .map(|i| {
            qp.write(
                local.clone(),
                i * 4096,
                4096,
                target.remote_at(i * 4096).unwrap(),
            )
        })
        .collect();
    for w in writes {
        let (result, _local) = w.await; // the buffer comes back with the outcome
        result?;
    }
    for i in 0..16 {
        let mut got = [0u8; 4096];
        target.read_at(i * 4096, &mut got)?;
        assert!(got.iter().all(|&b| b == i as u8), "block {i}");
    }

    // A READ into a pooled, pre-registered buffer: it comes back holding the data.
    let buffers = BufferPool::new(pd.clone(), PoolConfig::default())?;
    let buf = buffers.alloc(4096)?;
    let (result, buf) = qp.read(buf, 0, 4096, target.remote_at(3 * 4096)?).await;
    result?;
    let mut got = [0u8; 4096];
    buf.read_at(0, &mut got)?;
    assert!(got.iter().all(|&b| b == 3), "pooled READ");

    // Memory the caller owns, registered without `unsafe`, READ into, and given back.
    let owned = pd.register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)?;
    let (result, owned) = qp.read(owned, 0, 4096, target.remote_at(5 * 4096)?).await;
    result?;
    let plain: Vec<u8> = owned.into_inner(); // deregistered: an ordinary Vec again
    assert!(plain.iter().all(|&b| b == 5), "READ into a registered Vec");

    // A counter: a batch of eight fetch-and-adds, one doorbell, one completion.
    let counter = target.remote_at(0)?;
    target.write_at(0, &0u64.to_ne_bytes())?;
    let adds = (0..8)
        .map(|i| {
            (
                WrOp::FetchAdd {
                    remote: counter,
                    add: 1,
                },
                local.clone(),
                8 * i,
                8,
            )
        })
        .collect();
    let (result, _buffers) = qp.batch(adds).await;
    result?;
    assert_eq!(target.read_u64(0)?, 8);
    println!(
        "16 WRITEs, 2 READs and a batch of 8 FAAs checked; {} completions, {} wake-ups",
        engine.stats().completions,
        engine.stats().wakeups
    );
    Ok(())
}
