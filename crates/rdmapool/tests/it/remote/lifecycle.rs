//! Clients and servers that die, restart, drain or go away, and what happens to their chunks,
//! leases and connections.

use super::*;

#[test]
fn a_dead_client_keeps_its_chunks_until_its_lease_expires_a_live_one_forever() {
    let s = server(1, Duration::from_millis(400));
    let live = client(&[&s], 1).unwrap();
    let kept = live.block_on(live.alloc(64, None)).unwrap();
    let dying = client(&[&s], 2).unwrap();
    dying.block_on(dying.alloc(64, None)).unwrap();
    dying.block_on(dying.alloc(100_000, None)).unwrap();
    assert_eq!(s.stats().chunks_owned, 3);
    drop(dying); // stops renewing, as a crash would
    assert_eq!(s.stats().chunks_owned, 3, "not before the lease runs out");
    // The counters are added to once the sweep has run, just after the table changes: wait
    // for both (the slow guest's rxe once showed the table freed and the counters not yet).
    wait_until("the dead client's chunks come back", || {
        let st = s.stats();
        st.chunks_owned == 1 && st.expired_clients >= 1
    });
    let st = s.stats();
    assert_eq!((st.expired_clients, st.reclaimed_chunks), (1, 2));
    // Ten leases later the live client still has its chunk and its object.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(s.stats().expired_clients, 1);
    assert_eq!(live.block_on(live.fetch_and_add(kept, 0, 1)).unwrap(), 0);
    live.block_on(live.free(kept)).unwrap();
    assert_eq!(s.stats().chunks_owned, 0);
}

#[test]
fn a_restarted_client_finds_its_allocations_and_a_live_id_cannot_be_taken() {
    let s = server(1, Duration::from_secs(3));
    let first = client(&[&s], 77).unwrap();
    let mut mine: Vec<RemotePtr> = (0..5)
        .map(|i| first.block_on(first.alloc(100 + i, None)).unwrap())
        .collect();
    match client(&[&s], 77) {
        Err(Error::ClientIdInUse { id, .. }) => assert_eq!(id, 77),
        other => panic!("a live id taken twice: {:?}", other.map(|_| ())),
    }
    drop(first);
    let again = client(&[&s], 77).unwrap();
    let mut found = again.block_on(again.allocations()).unwrap();
    found.sort();
    mine.sort();
    assert_eq!(found.len(), mine.len());
    for (f, m) in found.iter().zip(&mine) {
        assert_eq!((f.node, f.offset), (m.node, m.offset));
        assert!(f.len >= m.len);
    }
    for p in mine {
        again.block_on(again.free(p)).unwrap();
    }
    assert_eq!(s.stats().chunks_owned, 0);
}

#[test]
fn a_dead_server_is_node_down_and_the_others_keep_working() {
    // 2 s leases, shorter than the client's 5 s operation deadline: while an operation on
    // the dead node runs out (seconds on rxe, where nothing reports the peer gone), the
    // lease on the healthy node must go on being renewed (tests/remote_frozen.rs).
    let a = server(1, Duration::from_secs(2));
    let b = server(2, Duration::from_secs(2));
    let c = client(&[&a, &b], 5).unwrap();
    let on_a = (0..4)
        .map(|_| c.block_on(c.alloc(64, None)).unwrap())
        .find(|p| p.node == 1)
        .expect("round-robin reaches node 1");
    drop(a);
    let mut err = None;
    wait_until("node 1 reported down", || {
        match c.block_on(c.fetch_and_add(on_a, 0, 1)) {
            Err(e @ Error::NodeDown { .. }) => {
                err = Some(e);
                true
            }
            _ => false,
        }
    });
    assert!(matches!(err, Some(Error::NodeDown { node: 1, .. })));
    for _ in 0..8 {
        let p = c.block_on(c.alloc(64, None)).unwrap();
        assert_eq!(p.node, 2);
        c.block_on(c.free(p)).unwrap();
    }
}

#[test]
fn a_draining_server_takes_no_new_chunks_and_stops_when_emptied() {
    let a = server(1, Duration::from_millis(400));
    let b = server(2, Duration::from_millis(400));
    let c = client(&[&a, &b], 8).unwrap();
    let on_a: Vec<RemotePtr> = (0..4)
        .map(|_| c.block_on(c.alloc(200_000, None)).unwrap())
        .filter(|p| p.node == 1)
        .collect();
    assert!(!on_a.is_empty());
    std::thread::scope(|s| {
        let drained = s.spawn(|| a.shutdown(Duration::from_secs(20)));
        wait_until("the client sees node 1 draining", || {
            c.nodes().iter().any(|n| n.node == 1 && n.draining)
        });
        for _ in 0..6 {
            let p = c.block_on(c.alloc(200_000, None)).unwrap();
            assert_eq!(p.node, 2, "no new chunks on a draining node");
            c.block_on(c.free(p)).unwrap();
        }
        for p in &on_a {
            c.block_on(c.free(*p)).unwrap();
        }
        assert_eq!(drained.join().unwrap(), 0, "drained once emptied");
    });
}

#[test]
fn a_gone_clients_connection_is_closed_once_its_lease_is_over() {
    // The server used to keep every accepted QP (with its sockets and responder thread) for
    // its whole life: one leaked QP per client that ever connected.
    let ctx = node_on(Transport::Auto).ctx;
    let cfg = ServerConfig {
        node: 1,
        size: 8 << 20,
        chunk_size: 256 << 10,
        clients: 64,
        // Longer than connecting three clients takes (RDMA CM on rxe: a few hundred ms
        // each), so that all four connections are seen before the first gone one expires.
        lease: Duration::from_secs(2),
        listen: listen(),
        ..ServerConfig::default()
    };
    let s = MemoryServer::start(&ctx, cfg).unwrap();
    let base = ctx.live_qps();
    let live = client(&[&s], 1).unwrap();
    for id in 2..5 {
        let c = client(&[&s], id).unwrap();
        c.block_on(c.alloc(64, None)).unwrap();
    }
    wait_until("four clients connected", || ctx.live_qps() == base + 4);
    wait_until("the three gone clients disconnected", || {
        ctx.live_qps() == base + 1
    });
    assert_eq!(s.stats().expired_clients, 3);
    // The live client's connection stayed.
    let p = live.block_on(live.alloc(64, None)).unwrap();
    assert_eq!(live.block_on(live.fetch_and_add(p, 0, 1)).unwrap(), 0);
}
