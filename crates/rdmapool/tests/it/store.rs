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

mod many;

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
    let n = node();
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
    // Puts go on with the two left; with one left, r = 2 cannot be met.
    st.block_on(st.put(b"after", b"x")).unwrap();
    drop(s[2].take());
    let until = Instant::now() + WAIT;
    loop {
        match st.block_on(st.put(b"alone", b"y")) {
            Err(Error::NotEnoughReplicas { live: 1, wanted: 2 }) => break,
            Err(Error::NodeDown { .. }) if Instant::now() < until => continue,
            other => panic!("{other:?}"),
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
    drop(if good == 1 { a } else { b });
    let until = Instant::now() + WAIT;
    loop {
        match st.block_on(st.get(b"precious")) {
            Err(Error::NodeDown { reason, .. }) if reason.contains("damaged") => break,
            Err(Error::NodeDown { .. }) if Instant::now() < until => continue,
            other => panic!("{other:?}"),
        }
    }
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

#[test]
fn large_values_are_striped_over_every_server_and_read_back_whole() {
    let lease = Duration::from_secs(10);
    let big = |node| {
        let listen = SocketAddr::new(listen_ip(), 0);
        server_of(node, lease, 96 << 20, listen).expect("server starts")
    };
    let s: Vec<MemoryServer> = (1..=3).map(big).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = store(&refs, 1, 2);
    // 3 MiB: twelve parts of 256 KiB less 100 bytes, each on two of the three servers.
    let three = value(5, 3 << 20);
    st.block_on(st.put(b"three", &three)).unwrap();
    for server in &s {
        let owned = server.stats().chunks_owned;
        assert!(
            owned >= 2,
            "index and parts on every server: {owned} chunks"
        );
    }
    assert_eq!(st.block_on(st.get(b"three")).unwrap().unwrap(), three);
    assert!(st.block_on(st.exists(b"three")).unwrap());
    assert_eq!(
        st.block_on(st.list(b"")).unwrap(),
        [b"three".to_vec()],
        "parts are not keys"
    );
    let at = st.block_on(st.locate(b"three")).unwrap();
    assert_eq!(at.len(), 2, "the manifest, on two servers");
    assert!(at[0].block.len < 1024, "a manifest is small: {at:?}");
    // The largest value there is, and one byte more.
    let max = value(9, 64 << 20);
    st.block_on(st.put(b"max", &max)).unwrap();
    let other = store(&refs, 2, 2);
    assert!(
        other.block_on(other.get(b"max")).unwrap().unwrap() == max,
        "64 MiB read back"
    );
    let over = vec![1u8; (64 << 20) + 1];
    assert!(matches!(
        st.block_on(st.put(b"over", &over)),
        Err(Error::Core(CoreError::OutOfLimits {
            what: "value length",
            ..
        }))
    ));
    // Replaced by a small value, then removed: the old parts are cleared after the grace.
    st.block_on(st.put(b"three", b"small now")).unwrap();
    assert_eq!(
        st.block_on(st.get(b"three")).unwrap().unwrap(),
        b"small now"
    );
    assert!(st.block_on(st.remove(b"max")).unwrap());
    assert_eq!(other.block_on(other.get(b"max")).unwrap(), None);
    std::thread::sleep(Duration::from_millis(60));
    let freed = st.block_on(st.flush_retired());
    let parts = 12 + (64usize << 20).div_ceil((256 << 10) - 100);
    assert!(
        freed >= 2 * parts,
        "every part's two copies cleared: {freed} of {parts} parts"
    );
    // A repair finds only the two keys (a value and a tombstone), nothing to copy.
    let r = st.block_on(st.repair()).unwrap();
    assert_eq!((r.keys, r.copied, r.failed), (2, 0, 0), "{r:?}");
    let handled: u64 = s.iter().map(|s| s.stats().requests_handled).sum();
    assert_eq!(handled, 0, "striped puts and gets are one-sided too");
}

#[test]
fn zero_copy_puts_and_gets_move_values_straight_between_registered_memory_and_the_servers() {
    let lease = Duration::from_secs(10);
    let big = |node| {
        let listen = SocketAddr::new(listen_ip(), 0);
        server_of(node, lease, 32 << 20, listen).expect("server starts")
    };
    let s: Vec<MemoryServer> = (1..=3).map(big).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = store(&refs, 1, 2);
    let pd = st.pool().pd();
    let region = |len: usize| Arc::new(pd.alloc_mr(len, AccessFlags::LOCAL_WRITE).unwrap());
    for (name, len) in [("small", 4000usize), ("striped", 3 << 20)] {
        let bytes = value(len, len);
        let src = region(len);
        src.write_at(0, &bytes).unwrap();
        st.block_on(st.put_from(name.as_bytes(), &Mr::share(&src)))
            .unwrap();
        // Read back into a larger buffer, and by the copying get; and the other way round.
        let out = region(len + 100);
        let got = st
            .block_on(st.get_into(name.as_bytes(), &Mr::share(&out)))
            .unwrap();
        assert_eq!(got, Some(len), "{name}");
        let mut back = vec![0u8; len];
        out.read_at(0, &mut back).unwrap();
        assert!(back == bytes, "{name}: the bytes put_from wrote");
        assert!(
            st.block_on(st.get(name.as_bytes())).unwrap().unwrap() == bytes,
            "{name}"
        );
        let copied = format!("{name}-copied");
        st.block_on(st.put(copied.as_bytes(), &bytes)).unwrap();
        let out2 = region(len);
        let got = st.block_on(st.get_into(copied.as_bytes(), &Mr::share(&out2)));
        assert_eq!(got.unwrap(), Some(len));
        out2.read_at(0, &mut back).unwrap();
        assert!(back == bytes, "{name}: get_into of a copying put");
        // Too small a buffer: a typed refusal.
        let small = region(len - 1);
        let r = st.block_on(st.get_into(name.as_bytes(), &Mr::share(&small)));
        assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{name}: {r:?}");
        // A sub-range of a region is a value too.
        let part = Mr::share_range(&src, 10, 100).unwrap();
        st.block_on(st.put_from(b"sub", &part)).unwrap();
        assert_eq!(
            st.block_on(st.get(b"sub")).unwrap().unwrap(),
            &bytes[10..110]
        );
    }
    // A damaged replica is read around, a removed key and a missing one are None.
    let at = st.block_on(st.locate(b"small")).unwrap();
    let p = st.pool();
    let damaged = at[0].block;
    let buf = Arc::new(p.pd().alloc_mr(8, AccessFlags::LOCAL_WRITE).unwrap());
    buf.write_at(0, &[0xEE]).unwrap();
    let (r, _) = p.block_on(p.write(damaged, damaged.len - 1, buf, 0, 1));
    r.unwrap();
    let out = region(4000);
    assert_eq!(
        st.block_on(st.get_into(b"small", &Mr::share(&out)))
            .unwrap(),
        Some(4000)
    );
    let mut back = vec![0u8; 4000];
    out.read_at(0, &mut back).unwrap();
    assert!(back == value(4000, 4000), "read from the sound replica");
    assert!(st.block_on(st.remove(b"small")).unwrap());
    assert_eq!(
        st.block_on(st.get_into(b"small", &Mr::share(&out)))
            .unwrap(),
        None
    );
    assert_eq!(
        st.block_on(st.get_into(b"never", &Mr::share(&out)))
            .unwrap(),
        None
    );
    let handled: u64 = s.iter().map(|s| s.stats().requests_handled).sum();
    assert_eq!(handled, 0);
}

#[test]
fn space_left_by_writers_that_are_gone_is_reclaimed_and_their_empty_chunks_given_back() {
    let lease = Duration::from_secs(1);
    let a = server(1, lease);
    let b = server(2, lease);
    let keys = 40;
    {
        let first = store(&[&a, &b], 7, 2);
        for i in 0..keys {
            let key = format!("k{i}");
            first
                .block_on(first.put(key.as_bytes(), &value(i, 3000)))
                .unwrap();
        }
        drop(first);
        // A second writer replaces every value, and goes away before its grace period
        // passed: the first writer's blocks stay allocated, named by no slot.
        let cfg = StoreConfig {
            grace: Duration::from_secs(60),
            ..StoreConfig::default()
        };
        let second = Store::new(pool(&[&a, &b], 8), cfg).unwrap();
        for i in 0..keys {
            let key = format!("k{i}");
            second
                .block_on(second.put(key.as_bytes(), &value(i + 100, 3000)))
                .unwrap();
        }
        assert_eq!(second.stats().retired, 2 * keys as u64);
    } // both clients go without a word; their leases run out
    wait_until("both writers' leases expire", || {
        a.stats().expired_clients + b.stats().expired_clients >= 4
    });
    let owned = || a.stats().chunks_owned + b.stats().chunks_owned;
    let before = owned();
    assert_eq!(
        before, 6,
        "on each server: the index, and a chunk of each writer"
    );
    let fixer = store(&[&a, &b], 9, 2);
    let first_look = fixer.block_on(fixer.repair()).unwrap();
    assert_eq!(
        (first_look.reclaimed, first_look.reclaim_pending),
        (0, 2 * keys),
        "found, not freed yet: {first_look:?}"
    );
    assert_eq!(owned(), before);
    std::thread::sleep(Duration::from_millis(150)); // twice the grace period, and more
    let second_look = fixer.block_on(fixer.repair()).unwrap();
    assert_eq!(
        (
            second_look.reclaimed,
            second_look.released,
            second_look.reclaim_pending
        ),
        (2 * keys, 2, 0),
        "{second_look:?}"
    );
    assert_eq!(
        owned(),
        before - 2,
        "the first writer's chunks are the pool's again"
    );
    for i in 0..keys {
        let key = format!("k{i}");
        let got = fixer.block_on(fixer.get(key.as_bytes())).unwrap();
        assert_eq!(
            got,
            Some(value(i + 100, 3000)),
            "{key}: named blocks are kept"
        );
    }
    let again = fixer.block_on(fixer.repair()).unwrap();
    assert_eq!(
        (again.reclaimed, again.released, again.reclaim_pending),
        (0, 0, 0)
    );
}

#[test]
fn tombstones_found_clean_twice_a_hold_apart_are_cleared_and_free_their_slots() {
    let lease = Duration::from_secs(10);
    let a = server(1, lease);
    let b = server(2, lease);
    let cfg = StoreConfig {
        grace: Duration::from_millis(50),
        tombstone_hold: Duration::from_millis(100),
        ..StoreConfig::default()
    };
    let st = Store::new(pool(&[&a, &b], 1), cfg).unwrap();
    let keys = 30;
    for i in 0..keys {
        let key = format!("gone{i}");
        st.block_on(st.put(key.as_bytes(), b"soon removed"))
            .unwrap();
        assert!(st.block_on(st.remove(key.as_bytes())).unwrap());
    }
    st.block_on(st.put(b"kept", b"stays")).unwrap();
    let first = st.block_on(st.repair()).unwrap();
    assert_eq!(first.tombstones_cleared, 0, "noted, not cleared: {first:?}");
    std::thread::sleep(Duration::from_millis(150));
    let second = st.block_on(st.repair()).unwrap();
    assert_eq!(second.tombstones_cleared, 2 * keys, "{second:?}");
    let third = st.block_on(st.repair()).unwrap();
    assert_eq!(third.keys, 1, "only the kept key is left: {third:?}");
    for i in 0..keys {
        let key = format!("gone{i}");
        assert_eq!(st.block_on(st.locate(key.as_bytes())).unwrap(), [], "{key}");
        assert_eq!(st.block_on(st.get(key.as_bytes())).unwrap(), None);
    }
    // A key put again starts a new sequence; the kept key is untouched.
    assert_eq!(st.block_on(st.put(b"gone0", b"back")).unwrap().seq, 1);
    assert_eq!(st.block_on(st.get(b"kept")).unwrap().unwrap(), b"stays");
    assert_eq!(
        st.block_on(st.list(b"")).unwrap(),
        [b"gone0".to_vec(), b"kept".to_vec()]
    );
}
