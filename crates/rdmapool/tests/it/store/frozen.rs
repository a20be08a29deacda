//! Issue #40: a server frozen (SIGSTOP) under two store clients, one of which finds it down
//! and one of which does not, then resumed. Keys are placed over the membership, not over
//! the servers a client reaches, and a put must reach every replica: so no put is
//! acknowledged on fewer replicas than a later get may read, both clients use the server
//! again once it answers, and the last acknowledged put of every key is what both read.

use super::*;
use crate::support::child::{parent_line, Child};
use std::collections::HashMap;

/// The child's side: role `server` runs node 1 over TCP until stdin closes.
#[test]
fn child_entry() {
    if std::env::var("RDMAPOOL_TEST_CHILD").as_deref() != Ok("server") {
        return; // an ordinary test run: nothing to do
    }
    let s = server_on_tcp(1, Duration::from_secs(2));
    println!("@{}", s.addr());
    while !parent_line().is_empty() {}
}

/// A store client over TCP (on the same host a local client would reach a frozen server's
/// memory directly, which keeps working).
fn tcp_store(addrs: &[SocketAddr], id: u64) -> Store {
    tcp_store_with(
        addrs,
        id,
        StoreConfig {
            replicas: 2,
            grace: Duration::from_millis(50),
            ..StoreConfig::default()
        },
    )
}

fn tcp_store_with(addrs: &[SocketAddr], id: u64, cfg: StoreConfig) -> Store {
    let n = node_on(Transport::Tcp);
    let c = PoolClient::connect(
        &n.ctx,
        &n.pd,
        &StaticMembership::new(addrs.to_vec()),
        ClientConfig::new(id),
    )
    .expect("client connects");
    Store::new(c, cfg).expect("store")
}

#[test]
fn a_frozen_server_keeps_its_keys_and_both_clients_agree_once_it_answers() {
    if soft_only("a stopped server process on loopback") {
        return;
    }
    let (frozen, addrs, _b, _c) = node_1_apart();
    let first = tcp_store(&addrs, 11);
    let second = tcp_store(&addrs, 12);
    let keys: Vec<String> = (0..24).map(|i| format!("key{i}")).collect();
    // The last acknowledged value of each key.
    let mut acked: HashMap<String, Vec<u8>> = HashMap::new();
    for k in &keys {
        first.block_on(first.put(k.as_bytes(), b"v1")).unwrap();
        acked.insert(k.clone(), b"v1".to_vec());
    }

    frozen.stop();
    // The first client finds node 1 down (its first operation there runs out at the
    // deadline); its keys' puts are refused, typed, and the others acknowledged.
    // The put that finds it down may be visible on the key's other replica (its swaps
    // went out with its writes, as a put that times out may have landed): not
    // acknowledged, but a get may read it.
    let (mut done, mut refused) = (0, 0);
    let mut maybe: HashMap<String, Vec<u8>> = HashMap::new();
    for k in &keys {
        match first.block_on(first.put(k.as_bytes(), b"v2")) {
            Ok(_) => {
                done += 1;
                acked.insert(k.clone(), b"v2".to_vec());
            }
            Err(Error::NodeDown { node: 1, .. }) => {
                refused += 1;
                maybe.insert(k.clone(), b"v2".to_vec());
            }
            Err(e) => panic!("{k}: {e}"),
        }
    }
    assert!(done > 0 && refused > 0, "{done} put, {refused} refused");
    // Gets read around it.
    for k in &keys {
        let got = first.block_on(first.get(k.as_bytes())).unwrap();
        assert!(
            got.as_deref() == Some(&acked[k][..]) || got == maybe.get(k).cloned(),
            "{k} while frozen: {got:?}"
        );
    }

    frozen.signal(libc::SIGCONT);
    // The first client uses node 1 again by itself (same incarnation, a new lease).
    wait_until("the first client rejoins the resumed server", || {
        keys.iter()
            .all(|k| first.block_on(first.exists(k.as_bytes())).is_ok())
            && first.pool().nodes().len() == 3
    });
    // The second client, which never saw it down (or saw it only now), puts every key;
    // then both read what it put.
    for k in &keys {
        let until = Instant::now() + WAIT;
        loop {
            match second.block_on(second.put(k.as_bytes(), b"v3")) {
                Ok(_) => break,
                // Its own lease there may have lapsed while the server was stopped: it
                // rejoins too.
                Err(Error::NodeDown { node: 1, .. }) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("{k}: {e}"),
            }
        }
        acked.insert(k.clone(), b"v3".to_vec());
    }
    for (name, st) in [("first", &first), ("second", &second)] {
        for k in &keys {
            let got = st.block_on(st.get(k.as_bytes())).unwrap();
            assert_eq!(got.as_deref(), Some(&acked[k][..]), "{name} reads {k}");
        }
    }
    // And the first client's puts are acknowledged again everywhere, read by both.
    for k in &keys {
        first.block_on(first.put(k.as_bytes(), b"v4")).unwrap();
    }
    for k in &keys {
        let got = second.block_on(second.get(k.as_bytes())).unwrap();
        assert_eq!(got.as_deref(), Some(&b"v4"[..]), "second reads {k}");
    }
}

/// Issue #40's resurrection case: removes while a server is frozen, repairs past the
/// tombstone hold, then the server resumes with the old versions. No acknowledged remove
/// is undone: the removes of its keys are refused while it is away (it stays their
/// replica), and no tombstone is cleared while a member is away.
#[test]
fn removes_made_while_a_server_is_frozen_stay_removed_when_it_resumes() {
    if soft_only("a stopped server process on loopback") {
        return;
    }
    let (frozen, addrs, _b, _c) = node_1_apart();
    let hold = Duration::from_millis(200);
    let cfg = || StoreConfig {
        replicas: 2,
        grace: Duration::from_millis(50),
        tombstone_hold: hold,
        ..StoreConfig::default()
    };
    let st = tcp_store_with(&addrs, 21, cfg());
    let keys: Vec<String> = (0..24).map(|i| format!("gone{i}")).collect();
    for k in &keys {
        st.block_on(st.put(k.as_bytes(), b"old")).unwrap();
    }
    frozen.stop();
    let mut removed = Vec::new();
    for k in &keys {
        match st.block_on(st.remove(k.as_bytes())) {
            Ok(true) => removed.push(k.clone()),
            Err(Error::NodeDown { node: 1, .. }) => {}
            other => panic!("{k}: {other:?}"),
        }
    }
    assert!(
        !removed.is_empty() && removed.len() < keys.len(),
        "{} of {} removed",
        removed.len(),
        keys.len()
    );
    // Repairs past the hold while it is away: nothing of the away member's keys is
    // cleared, and no tombstone.
    for _ in 0..2 {
        let r = st.block_on(st.repair()).unwrap();
        assert_eq!(r.tombstones_cleared, 0, "{r:?}");
        assert!(r.deferred > 0, "{r:?}");
        std::thread::sleep(hold * 2);
    }
    frozen.signal(libc::SIGCONT);
    wait_until("the client rejoins the resumed server", || {
        st.pool().nodes().len() == 3
    });
    // Now the tombstones go, past the hold, and the removed keys stay removed, for this
    // client and a fresh one, whose repair copies nothing back.
    let mut cleared = 0;
    for _ in 0..3 {
        let until = Instant::now() + WAIT;
        let r = loop {
            match st.block_on(st.repair()) {
                Ok(r) => break r,
                Err(Error::NodeDown { .. }) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("repair: {e}"),
            }
        };
        cleared += r.tombstones_cleared;
        std::thread::sleep(hold * 2);
    }
    assert!(cleared > 0, "the tombstones were never cleared");
    let fresh = tcp_store_with(&addrs, 22, cfg());
    let r = fresh.block_on(fresh.repair()).unwrap();
    assert_eq!((r.copied, r.conflicts), (0, 0), "{r:?}");
    for (name, s) in [("writer", &st), ("fresh", &fresh)] {
        for k in &keys {
            let got = s.block_on(s.get(k.as_bytes())).unwrap();
            if removed.contains(k) {
                assert_eq!(got, None, "{name}: {k} came back");
            } else {
                assert_eq!(got.as_deref(), Some(&b"old"[..]), "{name}: {k}");
            }
        }
    }
}

/// Node 1 in a child process (to be frozen), nodes 2 and 3 in this one, and the three
/// addresses.
fn node_1_apart() -> (Child, [SocketAddr; 3], MemoryServer, MemoryServer) {
    let mut frozen = Child::spawn(module_path!(), "server", &[]);
    let frozen_addr: SocketAddr = frozen.line().parse().unwrap();
    let lease = Duration::from_secs(10);
    let (b, c) = (server_on_tcp(2, lease), server_on_tcp(3, lease));
    let addrs = [frozen_addr, b.addr(), c.addr()];
    (frozen, addrs, b, c)
}

/// A server in this process, reached over TCP.
fn server_on_tcp(node: u32, lease: Duration) -> MemoryServer {
    MemoryServer::start(
        &node_on(Transport::Tcp).ctx,
        ServerConfig {
            node,
            size: 8 << 20,
            chunk_size: 1 << 20,
            clients: 16,
            lease,
            listen: SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), 0),
            ..ServerConfig::default()
        },
    )
    .expect("server starts")
}
