//! Per-server counters (issue #44, docs/STORE.md section 2): hits, misses, evictions and
//! expirations in each server's index chunk, added by the clients with fetch-and-add in
//! batches and read by `Store::server_stats`; exact once every client flushed, summed over
//! clients, each get counted on its key's first replica, each eviction on the server it
//! was made on.

use super::*;
use rdmapool::store::{placement, CacheConfig, KeyHash, ServerStats};
use std::time::SystemTime;

/// The server a get of `key` counts on: its first replica among nodes 1 to 3 (all up, no
/// view set), two replicas.
fn first_replica(key: &[u8]) -> u32 {
    placement::replicas(KeyHash::of(key), &[1, 2, 3], 2)[0]
}

/// A store of client `id` whose counts go out only by count or by an explicit flush: its
/// grace period is an hour, so the age rule (a 16th of it) never sends them in a test.
fn patient(servers: &[&MemoryServer], id: u64, cache: Option<CacheConfig>) -> Store {
    let cfg = StoreConfig {
        replicas: 2,
        grace: Duration::from_secs(3600),
        cache,
        ..StoreConfig::default()
    };
    Store::new(pool(servers, id), cfg).expect("store")
}

fn by_node(stats: &[ServerStats], node: u32) -> ServerStats {
    *stats
        .iter()
        .find(|s| s.node == node)
        .expect("a live server")
}

fn sum(stats: &[ServerStats], f: impl Fn(&ServerStats) -> u64) -> u64 {
    stats.iter().map(f).sum()
}

#[test]
fn gets_count_on_their_keys_first_replica_in_batches_and_exactly_after_a_flush() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let a = patient(&refs, 1, None);
    let b = patient(&refs, 2, None);
    let keys: Vec<String> = (0..20).map(|i| format!("key{i}")).collect();
    for k in &keys {
        a.block_on(a.put(k.as_bytes(), b"value")).unwrap();
    }
    // A value that expires, read once expired: an expiration (and a miss) on its first
    // replica; its reader replaces it with a tombstone, so the second get is a miss only.
    let ttl = Duration::from_millis(200);
    a.block_on(a.put_with_ttl(b"brief", b"gone soon", ttl))
        .unwrap();
    let end = SystemTime::now() + ttl;
    while SystemTime::now() <= end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut want = [ServerStats::default(); 4];
    let mut get = |st: &Store, key: &[u8], hit: bool| {
        assert_eq!(st.block_on(st.get(key)).unwrap().is_some(), hit, "{key:?}");
        let w = &mut want[first_replica(key) as usize];
        if hit {
            w.hits += 1;
        } else {
            w.misses += 1;
        }
    };
    // Client a: 20 hits, 10 misses, the expired key twice (fewer than 64 operations).
    for k in &keys {
        get(&a, k.as_bytes(), true);
    }
    for i in 0..10 {
        get(&a, format!("none{i}").as_bytes(), false);
    }
    get(&a, b"brief", false);
    get(&a, b"brief", false);
    want[first_replica(b"brief") as usize].expirations += 1;
    // No round trip per get: nothing was added yet (32 operations wait).
    let before = a.block_on(a.server_stats()).unwrap();
    assert_eq!(before.len(), 3);
    for st in &before {
        assert_eq!(
            (st.hits, st.misses, st.expirations),
            (0, 0, 0),
            "before 64 operations or a flush: {st:?}"
        );
    }
    // Client b: 64 gets (get_many and get_into among them) reach the batch: they go out
    // without a flush, exact.
    let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    for r in b.block_on(b.get_many(&ks)) {
        assert!(r.unwrap().is_some());
    }
    for k in &keys {
        let w = &mut want[first_replica(k.as_bytes()) as usize];
        w.hits += 1;
    }
    let out = Arc::new(
        b.pool()
            .pd()
            .alloc_mr(4096, AccessFlags::LOCAL_WRITE)
            .unwrap(),
    );
    for i in 0..44 {
        let key = format!("key{}", i % 22);
        let hit = i % 22 < 20;
        let got = b.block_on(b.get_into(key.as_bytes(), &Mr::share(&out)));
        assert_eq!(got.unwrap().is_some(), hit, "{key}");
        let w = &mut want[first_replica(key.as_bytes()) as usize];
        if hit {
            w.hits += 1;
        } else {
            w.misses += 1;
        }
    }
    let from_b = b.block_on(b.server_stats()).unwrap();
    assert_eq!(sum(&from_b, |s| s.hits + s.misses), 64, "{from_b:?}");
    // Both flushed: every server's counters are exact, and add up to the clients' own.
    a.block_on(a.flush_counters());
    b.block_on(b.flush_counters());
    let after = a.block_on(a.server_stats()).unwrap();
    for node in 1..=3u32 {
        let got = by_node(&after, node);
        let w = want[node as usize];
        assert_eq!(
            (got.hits, got.misses, got.evictions, got.expirations),
            (w.hits, w.misses, 0, w.expirations),
            "node {node}"
        );
        assert_eq!((got.used, got.budget), (0, 0), "not a cache: {got:?}");
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sum(&after, |s| s.hits), sa.hits + sb.hits);
    assert_eq!(sum(&after, |s| s.misses), sa.misses + sb.misses);
    assert_eq!(sum(&after, |s| s.expirations), sa.expired + sb.expired);
    assert_eq!((sa.hits, sa.misses, sa.expired), (20, 12, 1));
    // A flush with nothing waiting adds nothing.
    a.block_on(a.flush_counters());
    assert_eq!(a.block_on(a.server_stats()).unwrap(), after);
    let total = after.iter().fold(0, |t, s| t + s.hits);
    let rate = by_node(&after, first_replica(b"key0")).hit_rate().unwrap();
    assert!(total > 0 && rate > 0.0 && rate <= 1.0, "{after:?}");
}

#[test]
fn evictions_count_on_the_server_evicted_from() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let budget = 256 << 10;
    let st = patient(&refs, 3, Some(CacheConfig::new(budget)));
    // About 2 MiB of 1 KiB blocks (two replicas of 1000 values over three servers): far
    // above the budget of each.
    let value = vec![7u8; 900];
    for i in 0..1000 {
        st.block_on(st.put(format!("c{i}").as_bytes(), &value))
            .unwrap();
    }
    let (mut hits, mut misses) = (0, 0);
    for i in (0..1000).step_by(10) {
        match st.block_on(st.get(format!("c{i}").as_bytes())).unwrap() {
            Some(v) => {
                assert_eq!(v, value);
                hits += 1;
            }
            None => misses += 1,
        }
    }
    st.block_on(st.flush_counters());
    let own = st.stats();
    assert!(own.evictions > 0, "{own:?}");
    let servers = st.block_on(st.server_stats()).unwrap();
    assert_eq!(servers.len(), 3);
    assert_eq!(sum(&servers, |s| s.evictions), own.evictions, "{servers:?}");
    assert_eq!(sum(&servers, |s| s.hits), hits, "{servers:?}");
    assert_eq!(sum(&servers, |s| s.misses), misses, "{servers:?}");
    assert_eq!((own.hits, own.misses), (hits, misses));
    for srv in &servers {
        assert_eq!(srv.budget, budget);
        assert!(srv.used > 0, "a cache's usage word is read beside: {srv:?}");
    }
}
