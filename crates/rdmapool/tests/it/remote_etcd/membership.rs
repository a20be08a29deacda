//! Servers that register, crash, restart, leave, or were never real, as followers see them.

use super::*;
use rdmapool::CoreError;

#[test]
fn a_following_client_connects_to_servers_that_register_later_and_allocates_there() {
    let Some(etcd) = Etcd::start("join") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-join");
    let (s1, _r1) = registered(&cfg, 1);
    let members = EtcdMembership::new(&cfg).unwrap();
    assert_eq!(
        members
            .members()
            .unwrap()
            .iter()
            .map(|m| m.node)
            .collect::<Vec<_>>(),
        vec![1]
    );
    // Least-used placement: a server that joins (nothing used) takes the next allocation.
    let c = client(&members, 11, Box::new(LeastUsed));
    let follower = members.follow(c.clone()).unwrap();
    assert_eq!(follower.nodes(), vec![1]);
    let first = c.block_on(c.alloc(64, None)).unwrap();
    assert_eq!(first.node, 1);

    // A second client that is told of each server directly: what connecting costs without
    // etcd in the way.
    let direct = {
        let n = node();
        let first = StaticMembership::new(vec![s1.addr()]);
        PoolClient::connect(&n.ctx, &n.pd, &first, ClientConfig::new(12)).unwrap()
    };
    let buf = Arc::new(c.pd().alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap());
    let mut servers = Vec::new();
    let mut growth = Vec::new();
    for node in 2..=6u32 {
        let t0 = Instant::now();
        let s = server(node);
        let started = t0.elapsed();
        let r = EtcdRegistration::register(&cfg, node, s.addr()).unwrap();
        let registered = t0.elapsed();
        wait_until("the client connects to the new server", || {
            node_ids(&c).contains(&node) && follower.nodes().contains(&node)
        });
        let connected = t0.elapsed();
        let p = c.block_on(c.alloc(64, None)).unwrap();
        let allocated = t0.elapsed();
        assert_eq!(
            p.node, node,
            "least-used placement picks the empty newcomer"
        );
        let t1 = Instant::now();
        direct.add_server(s.addr()).unwrap();
        let add_server = t1.elapsed();
        eprintln!(
            "growth, node {node}: server up {:.1} ms, registered {:.1} ms, client connected \
             {:.1} ms, first allocation on it {:.1} ms (from the server's start); a direct \
             add_server takes {:.1} ms",
            ms(started),
            ms(registered),
            ms(connected),
            ms(allocated),
            ms(add_server)
        );
        growth.push((allocated, allocated - registered));
        // The memory is real: write and read it back.
        buf.write_at(0, &node.to_le_bytes()).unwrap();
        let (w, b) = c.block_on(c.write(p, 0, buf.clone(), 0, 4));
        w.unwrap();
        let (rd, b) = c.block_on(c.read(p, 0, b, 8, 4));
        rd.unwrap();
        let mut got = [0u8; 4];
        b.read_at(8, &mut got).unwrap();
        assert_eq!(u32::from_le_bytes(got), node);
        servers.push((s, r));
    }
    growth.sort();
    let (total, after_reg) = growth[growth.len() / 2];
    eprintln!(
        "growth (median of {}): {:.1} ms from server start to first allocation on it, {:.1} ms \
         of it after the registration was in etcd",
        growth.len(),
        ms(total),
        ms(after_reg)
    );
    assert_eq!(follower.nodes(), vec![1, 2, 3, 4, 5, 6]);
    let st = follower.stats();
    assert_eq!((st.joined, st.left), (5, 0));
    assert!(st.watches >= 1);
    drop(follower);
    drop(c);
    drop(direct);
    // Dropping a registration revokes its lease: the key goes at once.
    let (_s6, r6) = servers.pop().unwrap();
    drop(r6);
    let ids: Vec<u32> = members.members().unwrap().iter().map(|m| m.node).collect();
    assert_eq!(ids, vec![1, 2, 3, 4, 5]);
}

#[test]
fn a_crashed_servers_key_expires_and_clients_stop_trying_it() {
    let Some(etcd) = Etcd::start("crash") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-crash");
    let (_s1, _r1) = registered(&cfg, 1);
    let (s2, r2) = registered(&cfg, 2);
    let (_s3, _r3) = registered(&cfg, 3);
    let members = EtcdMembership::new(&cfg).unwrap();
    let c = client(&members, 21, Box::new(RoundRobin::default()));
    let follower = members.follow(c.clone()).unwrap();
    assert_eq!(follower.nodes(), vec![1, 2, 3]);
    let ptrs: Vec<RemotePtr> = (0..30)
        .map(|_| c.block_on(c.alloc(128, None)).unwrap())
        .collect();
    let on2: Vec<RemotePtr> = ptrs.iter().filter(|p| p.node == 2).copied().collect();
    assert!(!on2.is_empty());

    // Crash server 2: it stops renewing its lease without revoking it, and goes away.
    let t0 = Instant::now();
    r2.abandon();
    drop(s2);
    assert!(
        members.members().unwrap().iter().any(|m| m.node == 2),
        "a crash does not remove the key at once"
    );
    let gone_from_etcd = wait_until("the dead server's key expires", || {
        !members.members().unwrap().iter().any(|m| m.node == 2)
    });
    wait_until("the client drops the dead server", || {
        !follower.nodes().contains(&2) && !node_ids(&c).contains(&2)
    });
    let dropped = t0.elapsed();
    eprintln!(
        "crash: key gone from etcd {:.0} ms after the crash (TTL {:?}), client dropped the \
         server at {:.0} ms",
        ms(gone_from_etcd),
        cfg.ttl,
        ms(dropped)
    );
    assert!(
        gone_from_etcd >= cfg.ttl / 3,
        "the key went by lease expiry, not at once"
    );
    assert_eq!(follower.stats().left, 1);

    // Its pointers fail with NodeDown; new allocations go to the others.
    let buf = Arc::new(c.pd().alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap());
    for p in &on2 {
        let (r, _) = c.block_on(c.read(*p, 0, buf.clone(), 0, 8));
        assert!(matches!(r, Err(Error::NodeDown { node: 2, .. })), "{r:?}");
    }
    for _ in 0..30 {
        let p = c.block_on(c.alloc(128, None)).unwrap();
        assert_ne!(p.node, 2);
    }
    for p in ptrs.iter().filter(|p| p.node != 2) {
        c.block_on(c.free(*p)).unwrap();
    }

    // A replacement registering as node 2 is picked up again.
    let (_s2b, _r2b) = registered(&cfg, 2);
    wait_until(
        "the replacement joins (the client, then the follower says so)",
        || node_ids(&c).contains(&2) && follower.nodes().contains(&2),
    );
    assert_eq!(follower.nodes(), vec![1, 2, 3]);
    assert_eq!(follower.stats().joined, 1);
}

#[test]
fn a_server_restarted_at_the_same_address_within_its_ttl_is_reconnected() {
    let Some(etcd) = Etcd::start("restart") else {
        return;
    };
    let mut cfg = etcd.config("/rdmapool/test-restart");
    cfg.ttl = Duration::from_secs(10); // the old key outlives the restart
    let (_s1, _r1) = registered(&cfg, 1);
    let (s2, r2) = registered(&cfg, 2);
    let addr = s2.addr();
    let members = EtcdMembership::new(&cfg).unwrap();
    let c = client(&members, 41, Box::new(RoundRobin::default()));
    let follower = members.follow(c.clone()).unwrap();
    assert_eq!(follower.nodes(), vec![1, 2]);
    let before: Vec<RemotePtr> = (0..4)
        .map(|_| c.block_on(c.alloc(64, None)).unwrap())
        .filter(|p| p.node == 2)
        .collect();
    assert!(!before.is_empty());
    r2.abandon();
    drop(s2);
    // The client finds it down (its lease renewals fail) while the key stays.
    wait_until("the client sees node 2 down", || !node_ids(&c).contains(&2));
    assert_eq!(
        follower.nodes(),
        vec![1, 2],
        "the key stays: not removed yet"
    );
    let (_s2b, _r2b) = {
        let s = server_at(2, addr);
        let r = EtcdRegistration::register(&cfg, 2, s.addr()).unwrap();
        (s, r)
    };
    let t = wait_until("the restarted server is reconnected", || {
        node_ids(&c).contains(&2)
    });
    eprintln!(
        "restart at {addr}: reconnected {:.1} ms after it registered",
        ms(t)
    );
    let st = follower.stats();
    // The follower replaces it, unless the client rejoined the new incarnation by itself
    // first (it dials a down node again): either way it is connected once.
    assert!(st.replaced <= 1 && (st.left, st.joined) == (0, 1), "{st:?}");
    // Pointers into the old incarnation are refused before any byte moves: an idle holder
    // never reads the new server's memory through them.
    for p in &before {
        match c.block_on(c.fetch_and_add(*p, 0, 1)) {
            Err(Error::StalePointer { node: 2, .. }) => {}
            other => panic!("{p}: a pointer into the restarted server: {other:?}"),
        }
    }
    let p = (0..4)
        .map(|_| c.block_on(c.alloc(64, None)).unwrap())
        .find(|p| p.node == 2);
    assert!(p.is_some(), "allocations reach the restarted server");
}

#[test]
fn a_server_that_drops_its_registration_leaves_at_once() {
    let Some(etcd) = Etcd::start("leave") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-leave");
    let (_s1, _r1) = registered(&cfg, 1);
    let (_s2, r2) = registered(&cfg, 2);
    let members = EtcdMembership::new(&cfg).unwrap();
    let c = client(&members, 31, Box::new(RoundRobin::default()));
    let follower = members.follow(c.clone()).unwrap();
    assert_eq!(follower.nodes(), vec![1, 2]);
    // The lease is renewed while the registration lives (well past its TTL).
    std::thread::sleep(cfg.ttl + Duration::from_millis(500));
    assert!(r2.renewals() >= 2);
    assert_eq!(members.members().unwrap().len(), 2);
    let t0 = Instant::now();
    drop(r2); // revokes
    let left = wait_until("the client drops the server", || !node_ids(&c).contains(&2));
    eprintln!(
        "graceful leave: client dropped the server {:.1} ms after the revoke",
        ms(t0.elapsed())
    );
    assert!(
        left < cfg.ttl,
        "a revoke is seen before any lease would expire"
    );
    // An etcd that goes away is a typed error, not a panic.
    drop(follower);
    drop(etcd);
    assert!(matches!(
        members.members(),
        Err(Error::Core(CoreError::Connection { .. }))
    ));
}

/// Issue #22, finding 2: anyone who can write under the membership prefix could add a server
/// of their own (which got a share of the allocations, and read them) and black holes (which
/// kept the follower from joining a real new server for minutes: it dialled them one after
/// another, a connect timeout each). With the cluster key, a server that cannot prove it gets
/// nothing; joins run at once, so the holes cost one timeout per round, not ten.
#[test]
fn rogue_and_black_hole_entries_get_nothing_and_delay_no_real_server() {
    let Some(etcd) = Etcd::start("rogue") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-rogue");
    let key = PreSharedKey::new(&[5; 32]).unwrap();
    let keyed = |node: u32| {
        let s = server_with(
            node,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            Some(key.clone()),
        );
        let r = EtcdRegistration::register(&cfg, node, s.addr()).expect("registers");
        (s, r)
    };
    let _real = keyed(1);
    let (_rogue, _rogue_key) = registered(&cfg, 66);
    // Listening sockets that never answer: a connect waits out its timeout on each.
    let holes: Vec<TcpListener> = (0..10)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap())
        .collect();
    let _hole_keys: Vec<EtcdRegistration> = holes
        .iter()
        .enumerate()
        .map(|(i, h)| {
            EtcdRegistration::register(&cfg, 10 + i as u32, h.local_addr().unwrap()).unwrap()
        })
        .collect();
    let members = EtcdMembership::new(&cfg).unwrap();
    let n = node();
    let mut ccfg = ClientConfig::new(21);
    ccfg.cluster_key = Some(key.clone());
    let c = Arc::new(PoolClient::connect(&n.ctx, &n.pd, &members, ccfg).expect("connects"));
    assert_eq!(node_ids(&c), vec![1], "only the server that proved the key");
    let follower = members.follow(c.clone()).unwrap();
    // A real server registers later, after the holes in the follower's order (nodes 10 to
    // 19): joined although they are retried every round (one after another they held a
    // round for ten connect timeouts, 50 s).
    let _second = keyed(50);
    let waited = wait_until("the follower joins the real new server", || {
        node_ids(&c).contains(&50)
    });
    eprintln!("joined a real server {:.0} ms after it registered, next to 10 black holes and a rogue server", ms(waited));
    for _ in 0..40 {
        let p = c.block_on(c.alloc(4096, None)).unwrap();
        assert!(
            p.node == 1 || p.node == 50,
            "an allocation on node {}",
            p.node
        );
    }
    assert!(follower.stats().connect_failures >= 11);
}

/// Issue #41, finding 5: black-hole entries written one by one after the follower started
/// held it for a connect timeout each (every watch event waited for every hole's dial): ten
/// holes delayed a real server's join by 50.8 s. Now each entry is dialled on its own, so the
/// real server joins while the holes' first dials are still waiting (none has failed yet).
#[test]
fn black_holes_registered_one_by_one_delay_no_real_server() {
    let Some(etcd) = Etcd::start("holes") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-holes");
    let (_first, _first_key) = registered(&cfg, 1);
    let members = EtcdMembership::new(&cfg).unwrap();
    let n = node();
    let mut ccfg = ClientConfig::new(22);
    ccfg.connect_timeout = Duration::from_secs(20);
    let c = Arc::new(PoolClient::connect(&n.ctx, &n.pd, &members, ccfg).expect("connects"));
    let follower = members.follow(c.clone()).unwrap();
    let holes: Vec<TcpListener> = (0..10)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap())
        .collect();
    let _hole_keys: Vec<EtcdRegistration> = holes
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let r = EtcdRegistration::register(&cfg, 10 + i as u32, h.local_addr().unwrap());
            std::thread::sleep(Duration::from_millis(20)); // one watch event each
            r.unwrap()
        })
        .collect();
    let (_second, _second_key) = registered(&cfg, 50);
    let waited = wait_until("the follower joins the real server", || {
        node_ids(&c).contains(&50)
    });
    assert_eq!(
        follower.stats().connect_failures,
        0,
        "joined before any hole's dial (20 s each) ended"
    );
    eprintln!(
        "joined a real server {:.0} ms after it registered, behind 10 black holes registered one by one",
        ms(waited)
    );
}

/// Issue #41, finding 5's second half: an etcd writer rewrote a live server's key to another
/// address; followers dropped the server long enough for their leases there to lapse. Now a
/// live, proven node stays until the client finds it down.
#[test]
fn a_rewritten_key_does_not_drop_a_live_server() {
    let Some(etcd) = Etcd::start("rewrite") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-rewrite");
    let (_first, _first_key) = registered(&cfg, 1);
    let members = EtcdMembership::new(&cfg).unwrap();
    let c = client(&members, 23, Box::new(LeastUsed));
    let follower = members.follow(c.clone()).unwrap();
    // A server the follower joined (from its key), holding an object of the client's.
    let (_real, _real_key) = registered(&cfg, 2);
    wait_until("the follower joins node 2", || node_ids(&c).contains(&2));
    let p = (0..8)
        .map(|_| c.block_on(c.alloc(4096, None)).unwrap())
        .find(|p| p.node == 2)
        .expect("least used: an allocation on node 2");
    let hole = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let _forged = EtcdRegistration::register(&cfg, 2, hole.local_addr().unwrap()).unwrap();
    let listed = members.members().unwrap();
    assert_eq!(
        listed.iter().find(|m| m.node == 2).unwrap().addr,
        hole.local_addr().unwrap(),
        "the key now names the hole"
    );
    // Three watch rounds (a second each when quiet) with the key rewritten.
    std::thread::sleep(Duration::from_secs(3));
    let mut ids = node_ids(&c);
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2], "the live server is kept");
    c.block_on(c.check_live(p))
        .expect("its object is still there");
    assert_eq!(follower.stats().left + follower.stats().replaced, 0);
}

#[test]
fn a_store_follows_its_servers_through_etcd_and_repair_keeps_two_replicas() {
    use rdmapool::store::{Store, StoreConfig};
    let Some(etcd) = Etcd::start("store") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-store");
    let (s1, _r1) = registered(&cfg, 1);
    let (s2, r2) = registered(&cfg, 2);
    let members = EtcdMembership::new(&cfg).unwrap();
    let pool = client(&members, 31, Box::new(LeastUsed));
    let follower = members.follow(pool.clone()).unwrap();
    let st = Store::new(pool.clone(), StoreConfig::default()).unwrap();
    let value = |i: usize| format!("value {i} {}", "x".repeat(i * 7)).into_bytes();
    let keys = 30;
    for i in 0..keys {
        st.block_on(st.put(format!("k{i}").as_bytes(), &value(i)))
            .unwrap();
    }
    // A third server registers: the follower connects to it, and a repair moves the keys
    // it now ranks among the top two of there, letting them go on the one it displaced.
    let (s3, _r3) = registered(&cfg, 3);
    wait_until("the client joins node 3", || {
        node_ids(&pool).contains(&3) && follower.nodes().contains(&3)
    });
    let moved = st.block_on(st.repair()).unwrap();
    assert!(moved.copied > 0, "node 3 takes its share: {moved:?}");
    assert_eq!(moved.cleared, moved.copied, "{moved:?}");
    // Server 2 crashes: its key expires, the follower drops it, every key is read from its
    // other replica, and a repair makes two replicas again on nodes 1 and 3.
    r2.abandon();
    drop(s2);
    wait_until("the client drops the dead server", || {
        !follower.nodes().contains(&2) && !node_ids(&pool).contains(&2)
    });
    for i in 0..keys {
        let key = format!("k{i}");
        assert_eq!(
            st.block_on(st.get(key.as_bytes())).unwrap(),
            Some(value(i)),
            "{key}"
        );
    }
    let fixed = st.block_on(st.repair()).unwrap();
    assert_eq!(
        (fixed.nodes, fixed.failed, fixed.unreadable),
        (2, 0, 0),
        "{fixed:?}"
    );
    for i in 0..keys {
        let key = format!("k{i}");
        let at = st.block_on(st.locate(key.as_bytes())).unwrap();
        let mut nodes: Vec<u32> = at.iter().map(|l| l.block.node).collect();
        nodes.sort();
        assert_eq!(nodes, [1, 3], "{key}");
    }
    assert_eq!(
        s1.stats().requests_handled + s3.stats().requests_handled,
        0,
        "the store's data path and repair are one-sided"
    );
}

/// Issue #40, item 4: where etcd is used, the store's background repairer is elected through
/// an etcd lease, so exactly one client repairs at a time and another takes over when it
/// stops; the election's key is no server entry.
#[test]
fn the_store_repairer_is_elected_through_an_etcd_lease() {
    use rdmapool::store::{Repairer, Store, StoreConfig};
    let Some(etcd) = Etcd::start("elect") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-elect");
    let (_s1, _r1) = registered(&cfg, 1);
    let (_s2, _r2) = registered(&cfg, 2);
    // The election itself: one holder, the next after it resigns.
    let a = EtcdElection::new(&cfg, "test-role", 7).unwrap();
    let b = EtcdElection::new(&cfg, "test-role", 8).unwrap();
    assert!(a.lead().unwrap(), "a free role is taken");
    assert!(a.lead().unwrap(), "and held");
    assert!(!b.lead().unwrap(), "a held role is not taken");
    assert_eq!(b.holder().unwrap(), Some(7));
    a.resign();
    assert!(b.lead().unwrap(), "a resigned role is taken");
    assert_eq!(a.holder().unwrap(), Some(8));
    let members = EtcdMembership::new(&cfg).unwrap();
    assert_eq!(
        members.members().unwrap().len(),
        2,
        "the election's key is no server"
    );
    assert!(EtcdElection::new(&cfg, "a/b", 1).is_err());

    // Two store clients, each with a repairer every 100 ms: one repairs, the other defers.
    let stores: Vec<Arc<Store>> = [41, 42]
        .iter()
        .map(|&id| {
            let pool = client(&members, id, Box::new(LeastUsed));
            Arc::new(Store::new(pool, StoreConfig::default()).unwrap())
        })
        .collect();
    stores[0].block_on(stores[0].put(b"k", b"v")).unwrap();
    let mut repairers: Vec<Option<Repairer>> = stores
        .iter()
        .map(|s| {
            Some(Repairer::start_elected(s.clone(), Duration::from_millis(100), &cfg).unwrap())
        })
        .collect();
    let stats = |r: &Option<Repairer>| r.as_ref().unwrap().stats();
    wait_until("a repairer runs and the other defers", || {
        repairers.iter().any(|r| stats(r).runs >= 3)
            && repairers.iter().any(|r| stats(r).deferred_to_another >= 3)
    });
    let leader = repairers.iter().position(|r| stats(r).runs > 0).unwrap();
    let other = 1 - leader;
    assert_eq!(stats(&repairers[other]).runs, 0, "one repairer at a time");
    assert_eq!(stats(&repairers[leader]).deferred_to_another, 0);
    // The leader stops (resigns): the other takes over.
    repairers[leader] = None;
    wait_until("the other repairer takes over", || {
        stats(&repairers[other]).runs > 0
    });
    eprintln!(
        "client {} repaired, then client {} took over: {:?}",
        41 + leader,
        41 + other,
        stats(&repairers[other])
    );
}

/// Issue #40, item 1: with etcd, the store's view comes from etcd. The elected repairer
/// writes a view of the servers whose leases live, recorded in etcd by a write only the
/// election's holder can make and numbered by etcd's revision of it; a server whose lease
/// runs out leaves the view and one that registers joins it, keys move with each change,
/// and a client that places keys by an old view is fenced and still reads every key.
#[test]
fn the_store_view_follows_etcd_numbered_by_its_revisions() {
    use rdmapool::store::{Repairer, Store, StoreConfig, VIEW_KEY};
    let Some(etcd) = Etcd::start("view") else {
        return;
    };
    let prefix = "/rdmapool/test-view";
    let cfg = etcd.config(prefix);
    let (s1, _r1) = registered(&cfg, 1);
    let (s2, r2) = registered(&cfg, 2);
    let (s3, _r3) = registered(&cfg, 3);
    let members = EtcdMembership::new(&cfg).unwrap();
    // The repairer's client follows etcd; a second client only reads and writes.
    let pool = client(&members, 51, Box::new(LeastUsed));
    let _follower = members.follow(pool.clone()).unwrap();
    let st = Arc::new(Store::new(pool.clone(), StoreConfig::default()).unwrap());
    let reader_pool = client(&members, 52, Box::new(LeastUsed));
    let _reader_follower = members.follow(reader_pool.clone()).unwrap();
    let reader = Store::new(reader_pool.clone(), StoreConfig::default()).unwrap();
    // A candidate that does not hold the role cannot record a view.
    let outsider = EtcdElection::new(&cfg, "store-repairer", 99).unwrap();

    let repairer = Repairer::start_elected(st.clone(), Duration::from_millis(100), &cfg).unwrap();
    let view_is = |s: &Store, want: &[u32]| {
        s.block_on(s.view())
            .is_ok_and(|v| v.members == want && !v.moving())
    };
    wait_until("the repairer writes a view of 1, 2 and 3", || {
        view_is(&st, &[1, 2, 3])
    });
    let first = st.block_on(st.view()).unwrap();
    let (record, revision) = etcd.get(&format!("{prefix}/{VIEW_KEY}")).expect("recorded");
    assert_eq!(first.number, revision as u64, "numbered by etcd's revision");
    assert!(record.contains("[1,2,3]"), "{record}");
    assert_eq!(outsider.put_if_leading(VIEW_KEY, "{}").unwrap(), None);
    assert_eq!(
        etcd.get(&format!("{prefix}/{VIEW_KEY}")).unwrap().1,
        revision
    );

    let value = |i: usize| format!("value {i} {}", "y".repeat(i * 5)).into_bytes();
    let keys = 24;
    for i in 0..keys {
        reader
            .block_on(reader.put(format!("k{i}").as_bytes(), &value(i)))
            .unwrap();
    }
    // Server 2 crashes: its lease runs out, and the view drops it (a change, a repair
    // onto 1 and 3, a settle).
    r2.abandon();
    drop(s2);
    wait_until("the view drops node 2", || view_is(&st, &[1, 3]));
    let second = st.block_on(st.view()).unwrap();
    assert!(second.number > first.number);
    assert_eq!(
        etcd.get(&format!("{prefix}/{VIEW_KEY}")).unwrap().1 as u64,
        second.number
    );
    // The reader still places by the first view until a fence tells it otherwise: every
    // key is read, then it is on view `second`.
    for i in 0..keys {
        let key = format!("k{i}");
        assert_eq!(
            reader.block_on(reader.get(key.as_bytes())).unwrap(),
            Some(value(i)),
            "{key}"
        );
    }
    // Server 4 registers: the view takes it, and keys move onto it.
    let (s4, _r4) = registered(&cfg, 4);
    wait_until("the view takes node 4", || view_is(&st, &[1, 3, 4]));
    let third = st.block_on(st.view()).unwrap();
    assert!(third.number > second.number);
    for i in 0..keys {
        let key = format!("k{i}");
        // A put through the reader's old view is fenced and made under the new one.
        reader
            .block_on(reader.put(key.as_bytes(), &value(i + 1)))
            .unwrap();
        let at = st.block_on(st.locate(key.as_bytes())).unwrap();
        assert_eq!(at.len(), 2, "{key}: two replicas");
        assert_eq!(
            st.block_on(st.get(key.as_bytes())).unwrap(),
            Some(value(i + 1)),
            "{key}"
        );
    }
    let on_4 = s4.stats();
    let stats = repairer.stats();
    eprintln!(
        "views {} -> {} -> {}: repairer {stats:?}; reader fenced {} time(s); node 4 {on_4:?}",
        first.number,
        second.number,
        third.number,
        reader.stats().fenced
    );
    assert!(stats.views_changed >= 3, "{stats:?}");
    assert!(reader.stats().fenced > 0, "the reader met the fence");
    assert_eq!(
        s1.stats().requests_handled + s3.stats().requests_handled + on_4.requests_handled,
        0,
        "the data path, the view and its repairs are one-sided"
    );
}
