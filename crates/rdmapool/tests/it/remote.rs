//! The cross-node memory pool on real servers and clients (soft by default; the verbs suite
//! runs it in the SoftRoCE guest with RDMA CM on the guest's RDMA netdev).

use crate::support::*;
use rdmapool::fabric::*;
use rdmapool::remote::*;
use rdmapool::CoreError;
use rdmapool::Error;
use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod batch;
mod lifecycle;

/// Where servers listen: loopback on soft; the RDMA netdev's address on verbs (RDMA CM
/// cannot route over loopback).
fn listen() -> SocketAddr {
    let ip = match provider() {
        ProviderKind::Soft => IpAddr::V4(Ipv4Addr::LOCALHOST),
        ProviderKind::Verbs => std::env::var("RDMAPOOL_TEST_CM_IP")
            .expect("RDMAPOOL_TEST_CM_IP names the RDMA netdev's address in the verbs suite")
            .parse()
            .expect("an IP address"),
    };
    SocketAddr::new(ip, 0)
}

fn server(node: u32, lease: Duration) -> MemoryServer {
    let ctx = node_on(Transport::Auto).ctx;
    MemoryServer::start(
        &ctx,
        ServerConfig {
            node,
            size: 8 << 20,
            chunk_size: 256 << 10,
            clients: 64,
            lease,
            listen: listen(),
            ..ServerConfig::default()
        },
    )
    .expect("server starts")
}

fn client(servers: &[&MemoryServer], id: u64) -> rdmapool::Result<PoolClient> {
    let members = StaticMembership::new(servers.iter().map(|s| s.addr()).collect());
    let n = node();
    PoolClient::connect(&n.ctx, &n.pd, &members, ClientConfig::new(id))
}

/// A buffer on the client's PD that its operations move bytes through.
fn local(c: &PoolClient, len: usize) -> Arc<Mr> {
    Arc::new(c.pd().alloc_mr(len, AccessFlags::LOCAL_WRITE).unwrap())
}

/// xorshift64: reproducible randomness without a crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < until, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn random_operations_on_three_servers_match_a_model_and_the_servers_do_nothing() {
    let servers: Vec<MemoryServer> = (1..=3).map(|n| server(n, Duration::from_secs(2))).collect();
    let refs: Vec<&MemoryServer> = servers.iter().collect();
    let all_live: Arc<parking_lot::Mutex<Vec<RemotePtr>>> = Default::default();
    std::thread::scope(|s| {
        for id in 1..=3u64 {
            let refs = refs.clone();
            let all_live = all_live.clone();
            s.spawn(move || {
                let c = client(&refs, id).unwrap();
                let buf = local(&c, 8192);
                let mut rng = Rng(0x9e37_79b9 ^ id);
                let mut model: BTreeMap<RemotePtr, Vec<u8>> = BTreeMap::new();
                for step in 0..300 {
                    let r = rng.below(10);
                    if r < 5 || model.is_empty() {
                        let size = 1 + rng.below(3000);
                        let p = c.block_on(c.alloc(size, Some(rng.next()))).unwrap();
                        assert_eq!(p.len, size);
                        let data: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
                        buf.write_at(0, &data).unwrap();
                        c.block_on(c.write(p, 0, buf.clone(), 0, size as u32))
                            .0
                            .unwrap();
                        model.insert(p, data);
                    } else if r < 8 {
                        let k = rng.below(model.len() as u64) as usize;
                        let (p, data) = model.iter().nth(k).unwrap();
                        c.block_on(c.read(*p, 0, buf.clone(), 4096, p.len as u32))
                            .0
                            .unwrap();
                        let mut got = vec![0u8; p.len as usize];
                        buf.read_at(4096, &mut got).unwrap();
                        assert!(&got == data, "client {id} step {step}: {p:?} changed");
                    } else {
                        let k = rng.below(model.len() as u64) as usize;
                        let p = *model.keys().nth(k).unwrap();
                        c.block_on(c.free(p)).unwrap();
                        model.remove(&p);
                    }
                }
                all_live.lock().extend(model.keys().copied());
                // Every byte still as written, then everything freed.
                for (p, data) in &model {
                    c.block_on(c.read(*p, 0, buf.clone(), 0, p.len as u32))
                        .0
                        .unwrap();
                    let mut got = vec![0u8; p.len as usize];
                    buf.read_at(0, &mut got).unwrap();
                    assert!(&got == data, "client {id}: {p:?} changed at the end");
                }
                std::thread::sleep(Duration::from_millis(200)); // others check overlaps
                for p in model.keys() {
                    c.block_on(c.free(*p)).unwrap();
                }
            });
        }
        // While the clients hold their allocations: no byte is allocated twice.
        std::thread::sleep(Duration::from_millis(50));
    });
    let live = all_live.lock().clone();
    let mut seen: Vec<(u32, u64, u64)> = live.iter().map(|p| (p.node, p.offset, p.len)).collect();
    seen.sort();
    for w in seen.windows(2) {
        assert!(
            w[0].0 != w[1].0 || w[0].1 + w[0].2 <= w[1].1,
            "two allocations overlap: {w:?}"
        );
    }
    for s in &servers {
        let st = s.stats();
        assert_eq!(st.chunks_owned, 0, "node freed everything: {st:?}");
        assert_eq!(
            st.requests_handled, 0,
            "the server's CPU handled nothing: {st:?}"
        );
        assert!(st.connections >= 3);
    }
    // Everything freed is allocatable again: every chunk of every server, once.
    let c = client(&refs, 9).unwrap();
    let whole = 200 << 10;
    let mut got = HashSet::new();
    loop {
        match c.block_on(c.alloc(whole, None)) {
            Ok(p) => assert!(got.insert((p.node, p.offset)), "handed out twice: {p:?}"),
            Err(Error::RemoteExhausted { size }) => {
                assert_eq!(size, whole);
                break;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    let chunks: u64 = servers.iter().map(|s| s.stats().chunks).sum();
    assert_eq!(got.len() as u64, chunks);
}

#[test]
fn bad_input_gets_typed_errors_and_damages_nothing() {
    let s = server(1, Duration::from_secs(2));
    let c = client(&[&s], 3).unwrap();
    let buf = local(&c, 4096);
    let keep = c.block_on(c.alloc(64, None)).unwrap();
    c.block_on(c.fetch_and_add(keep, 8, 42)).unwrap();
    let p = c.block_on(c.alloc(64, None)).unwrap();
    c.block_on(c.free(p)).unwrap();
    assert!(
        matches!(c.block_on(c.free(p)), Err(Error::NotAllocated(_))),
        "double free"
    );
    let never = RemotePtr {
        offset: keep.offset + 64 * 100,
        ..keep
    };
    assert!(matches!(
        c.block_on(c.free(never)),
        Err(Error::NotAllocated(_))
    ));
    let misaligned = RemotePtr {
        offset: keep.offset + 1,
        ..keep
    };
    assert!(matches!(
        c.block_on(c.free(misaligned)),
        Err(Error::NotAllocated(_))
    ));
    let outside = RemotePtr { offset: 0, ..keep };
    assert!(matches!(
        c.block_on(c.free(outside)),
        Err(Error::NotAllocated(_))
    ));
    let other = c.block_on(c.alloc(64, None)).unwrap();
    let (r, _) = c.block_on(c.read(other, 60, buf.clone(), 0, 8));
    assert!(matches!(
        r,
        Err(Error::OutOfBounds {
            offset: 60,
            len: 8,
            limit: 64
        })
    ));
    let elsewhere = RemotePtr { node: 99, ..keep };
    assert!(matches!(
        c.block_on(c.free(elsewhere)),
        Err(Error::NodeDown { node: 99, .. })
    ));
    assert!(matches!(
        c.block_on(c.alloc(1 << 30, None)),
        Err(Error::Core(CoreError::OutOfLimits { value, .. })) if value == 1 << 30
    ));
    // None of that touched the object that stayed.
    assert_eq!(c.block_on(c.fetch_and_add(keep, 8, 0)).unwrap(), 42);
    // A peer that does not speak the pool's hello is refused.
    let n = node();
    let r = rdmapool::conn::connect(
        &n.pd,
        s.addr(),
        &rdmapool::conn::ConnectSpec::new(&n.pd, &n.cq, &QpConfig::default())
            .private_data(b"hello?")
            .timeout(Duration::from_secs(5)),
    );
    assert!(
        matches!(r, Err(Error::Core(CoreError::Rejected { .. }))),
        "{:?}",
        r.map(|_| ())
    );
    assert_eq!(s.stats().requests_handled, 0);
}

/// Polls every future until all are done (a minimal join for pipelined operations).
async fn join_all<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                if let std::task::Poll::Ready(v) = f.as_mut().poll(cx) {
                    *o = Some(v);
                }
            }
        }
        if out.iter().all(Option::is_some) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("done")).collect()
}

#[test]
fn operations_pipeline_many_in_flight() {
    let s = server(1, Duration::from_secs(2));
    let c = client(&[&s], 11).unwrap();
    let ptrs: Vec<RemotePtr> = c
        .block_on(join_all((0..32).map(|_| c.alloc(512, None)).collect()))
        .into_iter()
        .collect::<rdmapool::Result<_>>()
        .unwrap();
    let buf = local(&c, 32 * 512);
    for (i, _) in ptrs.iter().enumerate() {
        buf.write_at(i * 512, &[i as u8 + 1; 512]).unwrap();
    }
    let writes = ptrs
        .iter()
        .enumerate()
        .map(|(i, p)| c.write(*p, 0, buf.clone(), i * 512, 512))
        .collect();
    for (r, _) in c.block_on(join_all(writes)) {
        r.unwrap();
    }
    let back = local(&c, 32 * 512);
    let reads = ptrs
        .iter()
        .enumerate()
        .map(|(i, p)| c.read(*p, 0, back.clone(), (31 - i) * 512, 512))
        .collect();
    for (r, _) in c.block_on(join_all(reads)) {
        r.unwrap();
    }
    for i in 0..32 {
        let mut got = [0u8; 512];
        back.read_at((31 - i) * 512, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == i as u8 + 1), "object {i}");
    }
    let frees = ptrs.iter().map(|p| c.free(*p)).collect();
    for r in c.block_on(join_all(frees)) {
        r.unwrap();
    }
    assert_eq!(s.stats().chunks_owned, 0);
}

#[test]
fn a_server_with_a_bad_descriptor_is_refused_with_a_typed_error() {
    // A listener that accepts pool clients with a descriptor of another version.
    let n = node();
    let l = rdmapool::conn::Listener::bind(&n.pd, listen()).unwrap();
    let addr = l.local_addr();
    let fake = std::thread::spawn(move || {
        let req = l.get_request(Duration::from_secs(10)).unwrap();
        let mut bad = [0u8; DESCRIPTOR_LEN];
        bad[0..2].copy_from_slice(b"RP");
        bad[2] = 9; // version 9
        req.accept(&n.pd, &n.cq, &n.cq, &QpConfig::default(), &bad)
    });
    let members = StaticMembership::new(vec![addr]);
    let me = node();
    match PoolClient::connect(&me.ctx, &me.pd, &members, ClientConfig::new(1)) {
        Err(Error::NoServer { reason }) => {
            assert!(
                reason.contains("pool descriptor") && reason.contains("version 9"),
                "{reason}"
            )
        }
        other => panic!("a bad descriptor was taken: {:?}", other.map(|_| ())),
    }
    let _ = fake.join();
}

#[test]
fn objects_freed_by_other_clients_are_reused_by_the_chunks_owner() {
    let s = server(1, Duration::from_secs(2));
    let owner = client(&[&s], 21).unwrap();
    let other = client(&[&s], 22).unwrap();
    // 64 KiB objects: three fill a 256 KiB chunk.
    let full: Vec<RemotePtr> = (0..3)
        .map(|_| owner.block_on(owner.alloc(60_000, None)).unwrap())
        .collect();
    assert_eq!(s.stats().chunks_owned, 1);
    for p in &full {
        other.block_on(other.free(*p)).unwrap();
    }
    // The owner's own view still says "full"; before claiming a chunk it looks again.
    let again = owner.block_on(owner.alloc(60_000, None)).unwrap();
    assert_eq!(s.stats().chunks_owned, 1, "no second chunk claimed");
    assert!(
        full.iter().any(|p| p.offset == again.offset),
        "{again:?} reuses a freed object"
    );
    owner.block_on(owner.free(again)).unwrap();
    assert_eq!(s.stats().chunks_owned, 0);
}

#[test]
fn check_live_tells_live_freed_and_expired_allocations_apart() {
    let s = server(1, Duration::from_millis(400));
    let keeper = client(&[&s], 1).unwrap();
    let mine = keeper.block_on(keeper.alloc(64, None)).unwrap();
    let freed = keeper.block_on(keeper.alloc(64, None)).unwrap();
    keeper.block_on(keeper.free(freed)).unwrap();
    let dying = client(&[&s], 2).unwrap();
    let orphan = dying.block_on(dying.alloc(100, None)).unwrap();
    // Any client may ask about any pointer.
    keeper.block_on(keeper.check_live(mine)).unwrap();
    keeper.block_on(keeper.check_live(orphan)).unwrap();
    let e = keeper.block_on(keeper.check_live(freed)).unwrap_err();
    assert!(matches!(e, Error::NotAllocated(_)), "{e}");
    // Not the start of an object, and a node nobody serves.
    let inside = RemotePtr {
        offset: mine.offset + 8,
        ..mine
    };
    assert!(matches!(
        keeper.block_on(keeper.check_live(inside)),
        Err(Error::NotAllocated(_))
    ));
    let elsewhere = RemotePtr { node: 9, ..mine };
    assert!(matches!(
        keeper.block_on(keeper.check_live(elsewhere)),
        Err(Error::NodeDown { node: 9, .. })
    ));
    // The dying client stops renewing; once its lease runs out its object is not live,
    // while the keeper's still is.
    drop(dying);
    wait_until("the dead client's chunk is taken back", || {
        s.stats().expired_clients == 1
    });
    let e = keeper.block_on(keeper.check_live(orphan)).unwrap_err();
    assert!(
        matches!(&e, Error::NotAllocated(why) if why.contains("lease")),
        "{e}"
    );
    keeper.block_on(keeper.check_live(mine)).unwrap();
}
