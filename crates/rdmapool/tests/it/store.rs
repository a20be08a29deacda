//! The object store on real pool servers (issue #23, docs/STORE.md): put, get and remove
//! one-sided with `r` replicas; replicas that survive a server's loss, a damaged copy
//! detected and read around, objects that outlive their writer's lease, typed errors for
//! bad input.

use crate::support::*;
use rdmapool::fabric::*;
use rdmapool::remote::*;
use rdmapool::store::{RepairReport, Store, StoreConfig};
use rdmapool::{CoreError, Error};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod cache;
mod counters;
mod frozen;
mod large;
mod many;
mod repairer;
mod round_trips;
mod space;
mod ttl;
mod view;

fn server_at(node: u32, lease: Duration, listen: SocketAddr) -> rdmapool::Result<MemoryServer> {
    server_of(node, lease, 8 << 20, listen)
}

/// A server of `size` bytes in 1 MiB chunks.
fn server_of(
    node: u32,
    lease: Duration,
    size: usize,
    listen: SocketAddr,
) -> rdmapool::Result<MemoryServer> {
    let ctx = node_on(Transport::Auto).ctx;
    MemoryServer::start(
        &ctx,
        ServerConfig {
            node,
            size,
            chunk_size: 1 << 20,
            clients: 64,
            lease,
            listen,
            ..ServerConfig::default()
        },
    )
}

fn server(node: u32, lease: Duration) -> MemoryServer {
    server_at(node, lease, SocketAddr::new(listen_ip(), 0)).expect("server starts")
}

fn pool(servers: &[&MemoryServer], id: u64) -> PoolClient {
    pool_on(servers, id, Transport::Auto)
}

/// A pool client whose soft NIC reaches the servers over `transport`.
fn pool_on(servers: &[&MemoryServer], id: u64, transport: Transport) -> PoolClient {
    let n = node_on(transport);
    let addrs = servers.iter().map(|s| s.addr()).collect();
    PoolClient::connect(
        &n.ctx,
        &n.pd,
        &StaticMembership::new(addrs),
        ClientConfig::new(id),
    )
    .expect("client connects")
}

fn store(servers: &[&MemoryServer], id: u64, replicas: usize) -> Store {
    let cfg = StoreConfig {
        replicas,
        grace: Duration::from_millis(50),
        ..StoreConfig::default()
    };
    Store::new(pool(servers, id), cfg).expect("store")
}

fn value(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (i * 31 + k * 7) as u8).collect()
}

#[test]
fn puts_gets_and_removes_are_one_sided_and_land_on_r_distinct_servers() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = store(&refs, 1, 2);
    let sizes = [1, 64, 4000, 100_000];
    for i in 0..40 {
        let key = format!("key-{i}");
        st.block_on(st.put(key.as_bytes(), &value(i, sizes[i % 4])))
            .unwrap();
    }
    for i in 0..40 {
        let key = format!("key-{i}");
        let got = st.block_on(st.get(key.as_bytes())).unwrap();
        assert_eq!(got, Some(value(i, sizes[i % 4])), "{key}");
        let at = st.block_on(st.locate(key.as_bytes())).unwrap();
        assert_eq!(at.len(), 2, "{key}: {at:?}");
        assert_ne!(
            at[0].block.node, at[1].block.node,
            "{key}: distinct servers"
        );
        assert_eq!(at[0].version, at[1].version);
    }
    // Overwrite and remove.
    let v2 = st.block_on(st.put(b"key-0", b"second")).unwrap();
    assert_eq!(v2.seq, 2);
    assert_eq!(st.block_on(st.get(b"key-0")).unwrap().unwrap(), b"second");
    assert!(st.block_on(st.remove(b"key-1")).unwrap());
    assert!(!st.block_on(st.remove(b"key-1")).unwrap());
    assert_eq!(st.block_on(st.get(b"key-1")).unwrap(), None);
    assert!(!st.block_on(st.exists(b"never-put")).unwrap());
    let listed = st.block_on(st.list(b"key-1")).unwrap();
    let want: Vec<Vec<u8>> = [
        "key-10", "key-11", "key-12", "key-13", "key-14", "key-15", "key-16", "key-17", "key-18",
        "key-19",
    ]
    .iter()
    .map(|k| k.as_bytes().to_vec())
    .collect();
    assert_eq!(listed, want, "key-1 itself was removed");
    assert_eq!(st.block_on(st.list(b"")).unwrap().len(), 39);
    // A second client sees the same store.
    let other = store(&refs, 2, 2);
    assert_eq!(
        other.block_on(other.get(b"key-3")).unwrap(),
        Some(value(3, sizes[3]))
    );
    let handled: u64 = s.iter().map(|s| s.stats().requests_handled).sum();
    assert_eq!(handled, 0, "no server CPU on the data path");
    let stats = st.stats();
    assert_eq!((stats.puts, stats.removes), (41, 1));
}

#[test]
fn every_object_survives_the_loss_of_one_server_with_two_replicas() {
    let lease = Duration::from_secs(10);
    let mut s: Vec<Option<MemoryServer>> = (1..=3).map(|n| Some(server(n, lease))).collect();
    let refs: Vec<&MemoryServer> = s.iter().flatten().collect();
    let st = store(&refs, 1, 2);
    for i in 0..60 {
        st.block_on(st.put(format!("k{i}").as_bytes(), &value(i, 300)))
            .unwrap();
    }
    // Stop server 2 (its memory is gone with it).
    drop(s[1].take());
    for i in 0..60 {
        let key = format!("k{i}");
        // The first get of a key on the lost server may find it down mid-call; once the
        // client knows, every get reads from a replica that answers.
        let until = Instant::now() + WAIT;
        let got = loop {
            match st.block_on(st.get(key.as_bytes())) {
                Ok(v) => break v,
                Err(Error::NodeDown { .. }) if Instant::now() < until => continue,
                Err(e) => panic!("{key}: {e}"),
            }
        };
        assert_eq!(got, Some(value(i, 300)), "{key}");
    }
    // Node 2 stays a member, and so a replica of its keys, until the membership changes
    // (issue #40: keys are placed over the membership, not over the servers a client
    // reaches): a put of one of its keys fails typed, the others go on.
    let (mut done, mut refused) = (0, 0);
    for i in 0..24 {
        match st.block_on(st.put(format!("after{i}").as_bytes(), b"x")) {
            Ok(_) => done += 1,
            Err(Error::NodeDown { node: 2, .. }) => refused += 1,
            Err(e) => panic!("after{i}: {e}"),
        }
    }
    assert!(done > 0 && refused > 0, "{done} put, {refused} refused");
    // The operator takes it out of the membership: every put goes on with the two left.
    st.pool().remove_server(2);
    for i in 0..24 {
        st.block_on(st.put(format!("after{i}").as_bytes(), b"x"))
            .unwrap();
    }
    // With one left, r = 2 cannot be met: while node 3 is a member its keys (all of them)
    // are refused as down, once it left as too few.
    drop(s[2].take());
    let r = st.block_on(st.put(b"alone", b"y"));
    assert!(matches!(r, Err(Error::NodeDown { node: 3, .. })), "{r:?}");
    st.pool().remove_server(3);
    let r = st.block_on(st.put(b"alone", b"y"));
    assert!(
        matches!(r, Err(Error::NotEnoughReplicas { live: 1, wanted: 2 })),
        "{r:?}"
    );
}

/// Issue #40: a member listed but not reached when the client connects keeps its place:
/// puts wait for it (`MemberUnreached`: its node id, and so its keys, are unknown), gets go
/// on, and the client dials it by itself until it answers.
#[test]
fn a_member_not_up_when_the_client_connects_is_dialled_until_it_answers() {
    let lease = Duration::from_secs(10);
    let a = server(1, lease);
    let b = server(2, lease);
    // A port that nothing listens on yet; the server comes up there later.
    let later = std::net::TcpListener::bind(SocketAddr::new(listen_ip(), 0))
        .and_then(|l| l.local_addr())
        .unwrap();
    let n = node();
    let c = PoolClient::connect(
        &n.ctx,
        &n.pd,
        &StaticMembership::new(vec![a.addr(), b.addr(), later]),
        ClientConfig::new(31),
    )
    .unwrap();
    assert_eq!(c.unreachable().len(), 1);
    let st = Store::new(
        c,
        StoreConfig {
            replicas: 2,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let r = st.block_on(st.put(b"k", b"v"));
    assert!(matches!(r, Err(Error::MemberUnreached { .. })), "{r:?}");
    assert_eq!(st.block_on(st.get(b"k")).unwrap(), None, "gets go on");
    let Ok(c3) = server_at(3, lease, later) else {
        eprintln!("the port was taken meanwhile: nothing to check");
        return;
    };
    wait_until("the client reaches the third member", || {
        st.pool().unreachable().is_empty()
    });
    assert_eq!(st.pool().nodes().len(), 3);
    st.block_on(st.put(b"k", b"v")).unwrap();
    assert_eq!(
        st.block_on(st.get(b"k")).unwrap().as_deref(),
        Some(&b"v"[..])
    );
    drop(c3);
}

/// Issue #40, item 3: a server that left the membership (etcd dropped it, or the
/// operator) and comes back under the same incarnation with what it held brings no removed
/// key back: no tombstone is cleared while it may come back unseen, and a complete repair
/// once it is back replaces its old copies before any tombstone goes.
#[test]
fn a_server_that_left_and_comes_back_with_old_copies_brings_no_removed_key_back() {
    let lease = Duration::from_secs(10);
    let (s1, s2, s3) = (server(1, lease), server(2, lease), server(3, lease));
    let hold = Duration::from_millis(100);
    let st = Store::new(
        pool(&[&s1, &s2, &s3], 51),
        StoreConfig {
            replicas: 2,
            grace: Duration::from_millis(50),
            tombstone_hold: hold,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let keys: Vec<String> = (0..24).map(|i| format!("gone{i}")).collect();
    for k in &keys {
        st.block_on(st.put(k.as_bytes(), b"old")).unwrap();
    }
    // Node 3 leaves the membership with its copies, and every key is removed meanwhile.
    st.pool().remove_server(3);
    for k in &keys {
        assert!(st.block_on(st.remove(k.as_bytes())).unwrap(), "{k}");
    }
    let repair = |st: &Store| st.block_on(st.repair()).unwrap();
    for _ in 0..3 {
        let r = repair(&st);
        assert_eq!(r.tombstones_cleared, 0, "while node 3 may come back: {r:?}");
        std::thread::sleep(hold * 2);
    }
    // It comes back as it was (same incarnation, its old copies): a complete repair puts
    // the removes on it; only then do the tombstones go.
    st.pool().add_server(s3.addr()).unwrap();
    let mut cleared = 0;
    for _ in 0..4 {
        cleared += repair(&st).tombstones_cleared;
        std::thread::sleep(hold * 2);
    }
    assert!(cleared > 0, "the tombstones were never cleared");
    let fresh = store(&[&s1, &s2, &s3], 52, 2);
    let r = fresh.block_on(fresh.repair()).unwrap();
    for (name, s) in [("client", &st), ("fresh", &fresh)] {
        for k in &keys {
            assert_eq!(
                s.block_on(s.get(k.as_bytes())).unwrap(),
                None,
                "{name}: {k} came back ({r:?})"
            );
        }
    }
}

#[test]
fn a_damaged_replica_is_detected_by_checksum_and_read_around() {
    let lease = Duration::from_secs(10);
    let a = server(1, lease);
    let b = server(2, lease);
    let st = store(&[&a, &b], 1, 2);
    st.block_on(st.put(b"precious", b"the right bytes"))
        .unwrap();
    let at = st.block_on(st.locate(b"precious")).unwrap();
    assert_eq!(at.len(), 2);
    // Flip a byte of the value in one replica's memory (a fault, or a lie).
    let damaged = at[0].block;
    let p = st.pool();
    let buf = Arc::new(p.pd().alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap());
    let (r, buf) = p.block_on(p.read(damaged, 0, buf, 0, damaged.len as u32));
    r.unwrap();
    let last = damaged.len as usize - 1;
    let mut byte = [0u8];
    buf.read_at(last, &mut byte).unwrap();
    buf.write_at(0, &[byte[0] ^ 0x20]).unwrap();
    let (r, _) = p.block_on(p.write(damaged, last as u64, buf, 0, 1));
    r.unwrap();
    assert_eq!(
        st.block_on(st.get(b"precious")).unwrap().unwrap(),
        b"the right bytes"
    );
    // With the good copy's server gone, the damaged one is no answer, and not "missing".
    let good = at[1].block.node;
    let left = if good == 1 {
        drop(a);
        b
    } else {
        drop(b);
        a
    };
    let until = Instant::now() + WAIT;
    loop {
        match st.block_on(st.get(b"precious")) {
            Err(Error::NodeDown { reason, .. }) if reason.contains("damaged") => break,
            Err(Error::NodeDown { .. }) if Instant::now() < until => continue,
            other => panic!("{other:?}"),
        }
    }
    // Issue #40: a client that connects after the crash, and so never saw the good copy's
    // server, gets `Damaged`, not "not found".
    let fresh = store(&[&left], 9, 2);
    let got = fresh.block_on(fresh.get(b"precious"));
    assert!(matches!(got, Err(Error::Damaged { .. })), "{got:?}");
}

/// Issue #40: with every copy of a key damaged, `get`, `get_many`, `get_into` and `exists`
/// fail `Damaged`: damaged data is never "not found".
#[test]
fn every_copy_damaged_is_an_error_never_not_found() {
    let lease = Duration::from_secs(10);
    let a = server(1, lease);
    let b = server(2, lease);
    let st = store(&[&a, &b], 1, 2);
    st.block_on(st.put(b"precious", b"the right bytes"))
        .unwrap();
    let p = st.pool();
    let buf = Arc::new(p.pd().alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap());
    let located = st.block_on(st.locate(b"precious")).unwrap();
    assert_eq!(located.len(), 2);
    for at in located {
        // The value's first byte ('t', after the 64-byte header and the 8-byte key) to 'T'.
        buf.write_at(0, b"T").unwrap();
        p.block_on(p.write(at.block, 64 + 8, buf.clone(), 0, 1))
            .0
            .unwrap();
    }
    let got = st.block_on(st.get(b"precious"));
    assert!(matches!(got, Err(Error::Damaged { .. })), "get: {got:?}");
    let many = st.block_on(st.get_many(&[b"precious".as_slice(), b"absent"]));
    assert!(
        matches!(many[0], Err(Error::Damaged { .. })),
        "get_many: {:?}",
        many[0]
    );
    assert!(matches!(many[1], Ok(None)), "get_many: {:?}", many[1]);
    let ex = st.block_on(st.exists(b"precious"));
    assert!(matches!(ex, Err(Error::Damaged { .. })), "exists: {ex:?}");
    let exm = st.block_on(st.exists_many(&[b"precious".as_slice(), b"absent"]));
    assert!(
        matches!(exm[0], Err(Error::Damaged { .. })),
        "exists_many: {:?}",
        exm[0]
    );
    assert!(matches!(exm[1], Ok(false)), "exists_many: {:?}", exm[1]);
    let out = rdmapool::fabric::Mr::share(&Arc::new(
        p.pd().alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap(),
    ));
    let into = st.block_on(st.get_into(b"precious", &out));
    assert!(
        matches!(into, Err(Error::Damaged { .. })),
        "get_into: {into:?}"
    );
}

#[test]
fn objects_outlive_the_lease_of_the_client_that_wrote_them() {
    let lease = Duration::from_millis(300);
    let a = server(1, lease);
    let b = server(2, lease);
    {
        let writer = store(&[&a, &b], 7, 2);
        writer
            .block_on(writer.put(b"durable", b"kept by the store"))
            .unwrap();
        // A plain pool allocation of the same client dies with its lease.
        writer
            .pool()
            .block_on(writer.pool().alloc(100, None))
            .unwrap();
    } // the writer goes away without a word; its lease runs out
    wait_until("the servers expire the writer's lease", || {
        a.stats().expired_clients + b.stats().expired_clients >= 2
    });
    let reclaimed = a.stats().reclaimed_chunks + b.stats().reclaimed_chunks;
    assert!(reclaimed >= 1, "the plain allocation's chunk is taken back");
    let reader = store(&[&a, &b], 8, 2);
    assert_eq!(
        reader.block_on(reader.get(b"durable")).unwrap().unwrap(),
        b"kept by the store"
    );
    // The reader can overwrite it, and the writer's old block is freed after the grace.
    reader.block_on(reader.put(b"durable", b"v2")).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(reader.block_on(reader.flush_retired()), 2);
}

#[test]
fn bad_input_gets_typed_errors_and_damages_nothing() {
    let lease = Duration::from_secs(10);
    let a = server(1, lease);
    let b = server(2, lease);
    let st = store(&[&a, &b], 1, 2);
    st.block_on(st.put(b"ok", b"fine")).unwrap();
    let long_key = vec![b'k'; 256];
    for r in [
        st.block_on(st.put(&long_key, b"v")).map(|_| ()),
        st.block_on(st.put(b"", b"v")).map(|_| ()),
        st.block_on(st.put(b"k", b"")).map(|_| ()),
        st.block_on(st.get(&long_key)).map(|_| ()),
    ] {
        assert!(
            matches!(r, Err(Error::Core(CoreError::OutOfLimits { .. }))),
            "{r:?}"
        );
    }
    // Keys of the parts of striped values are not users' keys.
    let mut reserved = b"\0RDSPART".to_vec();
    reserved.extend_from_slice(b"mine");
    assert!(matches!(
        st.block_on(st.put(&reserved, b"v")),
        Err(Error::ReservedKey)
    ));
    assert!(matches!(
        st.block_on(st.get(&reserved)),
        Err(Error::ReservedKey)
    ));
    // A striped value larger than the servers have room for: refused when they are full,
    // and the parts already written are cleared, so the room is there again.
    let huge = vec![1u8; 12 << 20];
    let r = st.block_on(st.put(b"big", &huge));
    assert!(matches!(r, Err(Error::RemoteExhausted { .. })), "{r:?}");
    let owned = (a.stats().chunks_owned, b.stats().chunks_owned);
    assert_eq!(
        owned,
        (2, 2),
        "the index and one small block's chunk on each, no part"
    );
    let big = value(3, 2 << 20);
    st.block_on(st.put(b"big", &big)).unwrap();
    assert_eq!(st.block_on(st.get(b"big")).unwrap().unwrap(), big);
    assert!(st.block_on(st.remove(b"big")).unwrap());
    // Three replicas of two servers.
    let three = store(&[&a, &b], 2, 3);
    assert!(matches!(
        three.block_on(three.put(b"x", b"y")),
        Err(Error::NotEnoughReplicas { live: 2, wanted: 3 })
    ));
    assert_eq!(st.block_on(st.get(b"ok")).unwrap().unwrap(), b"fine");
    assert_eq!(st.block_on(st.get(b"big")).unwrap(), None);
}

/// Each of `keys` (with `i`, its value's seed) on `st`: two replicas of one version, and
/// the value put (or none for the removed ones, `i < removed`).
fn every_key_whole(st: &Store, keys: usize, removed: usize) {
    for i in 0..keys {
        let key = format!("k{i}");
        let at = st.block_on(st.locate(key.as_bytes())).unwrap();
        assert_eq!(at.len(), 2, "{key}: {at:?}");
        assert_eq!(at[0].version, at[1].version, "{key}");
        let want = (i >= removed).then(|| value(i, 300));
        assert_eq!(st.block_on(st.get(key.as_bytes())).unwrap(), want, "{key}");
    }
}

#[test]
fn repair_restores_r_replicas_after_a_restart_and_rebalances_onto_a_joined_server() {
    let lease = Duration::from_secs(10);
    let s1 = server(1, lease);
    let s2 = server(2, lease);
    let s3 = server(3, lease);
    let writer = store(&[&s1, &s2, &s3], 1, 2);
    let (keys, removed) = (60, 5);
    for i in 0..keys {
        let key = format!("k{i}");
        writer
            .block_on(writer.put(key.as_bytes(), &value(i, 300)))
            .unwrap();
    }
    for i in 0..removed {
        assert!(writer
            .block_on(writer.remove(format!("k{i}").as_bytes()))
            .unwrap());
    }
    // Node 2 is killed and started again where it was: same id, empty memory.
    let addr2 = s2.addr();
    drop(s2);
    let s2 = start_again("restart node 2", || server_at(2, lease, addr2));
    let fixer = store(&[&s1, &s2, &s3], 2, 2);
    let lost: usize = (0..keys)
        .filter(|i| {
            let at = fixer.block_on(fixer.locate(format!("k{i}").as_bytes()));
            at.unwrap().len() < 2
        })
        .count();
    assert!(lost > 0, "node 2 held replicas");
    let r = fixer.block_on(fixer.repair()).unwrap();
    assert_eq!((r.nodes, r.keys), (3, keys));
    assert_eq!(
        (r.copied, r.unreadable, r.failed, r.conflicts),
        (lost, 0, 0, 0),
        "{r:?}"
    );
    every_key_whole(&fixer, keys, removed);
    let again = fixer.block_on(fixer.repair()).unwrap();
    assert_eq!(
        (again.copied, again.cleared),
        (0, 0),
        "nothing left: {again:?}"
    );
    // The writer's client rejoins node 2 by itself and reads every key.
    for i in removed..keys {
        let key = format!("k{i}");
        let until = Instant::now() + WAIT;
        let got = loop {
            match writer.block_on(writer.get(key.as_bytes())) {
                Ok(v) => break v,
                Err(Error::NodeDown { .. } | Error::StalePointer { .. })
                    if Instant::now() < until =>
                {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("{key}: {e}"),
            }
        };
        assert_eq!(got, Some(value(i, 300)), "{key}");
    }
    // Node 4 joins: each key it now ranks among the top two of is copied there and let go
    // by the node it displaced.
    let s4 = server(4, lease);
    let mover = store(&[&s1, &s2, &s3, &s4], 3, 2);
    let r: RepairReport = mover.block_on(mover.repair()).unwrap();
    assert_eq!((r.nodes, r.keys), (4, keys));
    assert!(r.copied > 0, "node 4 takes its share: {r:?}");
    assert_eq!(r.cleared, r.copied, "one entry let go per copy: {r:?}");
    every_key_whole(&mover, keys, removed);
    let again = mover.block_on(mover.repair()).unwrap();
    assert_eq!((again.copied, again.cleared), (0, 0), "{again:?}");
    let handled: u64 = [&s1, &s2, &s3, &s4]
        .iter()
        .map(|s| s.stats().requests_handled)
        .sum();
    assert_eq!(handled, 0, "repair is one-sided too");
}

/// Issue #42, item 5: the store reports its own counters through its context's metrics (a
/// section the layers above core register; core knows nothing of stores), in Prometheus and
/// JSON, and leaves them when it is dropped.
#[test]
fn a_store_reports_its_counters_in_its_contexts_metrics() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=2).map(|n| server(n, lease)).collect();
    let n = node();
    let addrs = s.iter().map(|s| s.addr()).collect();
    let p = PoolClient::connect(
        &n.ctx,
        &n.pd,
        &StaticMembership::new(addrs),
        ClientConfig::new(77),
    )
    .expect("client connects");
    let st = Store::new(p, StoreConfig::default()).unwrap();
    for i in 0..3 {
        st.block_on(st.put(format!("k{i}").as_bytes(), b"v"))
            .unwrap();
    }
    assert!(st.block_on(st.get(b"k0")).unwrap().is_some());
    assert!(st.block_on(st.get(b"nothing")).unwrap().is_none());
    assert!(st.block_on(st.remove(b"k1")).unwrap());
    let snap = n.ctx.metrics().snapshot();
    let sec = snap
        .sections
        .iter()
        .find(|s| s.family == "store_clients" && s.label == ("client", 77))
        .expect("the store's section");
    let value = |key: &str| sec.series.iter().find(|v| v.key == key).unwrap().value;
    let own = st.stats();
    assert_eq!(
        (
            value("puts"),
            value("hits"),
            value("misses"),
            value("removes")
        ),
        (own.puts, own.hits, own.misses, own.removes)
    );
    assert_eq!((own.puts, own.hits, own.misses, own.removes), (3, 1, 1, 1));
    let text = snap.to_prometheus();
    assert!(
        text.contains("# TYPE rdmapool_store_puts_total counter\n"),
        "{text}"
    );
    assert!(
        text.contains("rdmapool_store_puts_total{client=\"77\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains("rdmapool_store_misses_total{client=\"77\"} 1\n"),
        "{text}"
    );
    let json = snap.to_json();
    assert!(
        json.contains("\"store_clients\":[{\"client\":77,\"puts\":3,\"hits\":1,\"misses\":1,"),
        "{json}"
    );
    drop(st);
    let after = n.ctx.metrics().snapshot();
    assert!(
        after.sections.iter().all(|s| s.family != "store_clients"),
        "a dropped store leaves the listing"
    );
}
