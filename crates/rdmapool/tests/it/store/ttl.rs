//! Values with a time to live (docs/STORE.md section 11): never returned once their end
//! has passed, by any get (single, many, into memory), exists or list; the older value
//! they replaced never comes back; the first reader replaces an expired value with a
//! tombstone so its space is freed; bad times to live are typed errors.

use super::*;
use std::time::SystemTime;

/// Waits until the wall clock is past `end` (the writer's clock: this host's).
fn wait_past(end: SystemTime) {
    while SystemTime::now() <= end {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_value_with_a_time_to_live_is_never_returned_after_it_nor_is_the_value_it_replaced() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = store(&refs, 1, 2);
    let ttl = Duration::from_millis(300);
    for k in ["a", "b", "c", "d"] {
        st.block_on(st.put(k.as_bytes(), b"older, no expiry"))
            .unwrap();
        st.block_on(st.put_with_ttl(k.as_bytes(), b"expiring", ttl))
            .unwrap();
    }
    let end = SystemTime::now() + ttl;
    // A long-lived key beside them.
    st.block_on(st.put_with_ttl(b"long", b"stays", Duration::from_secs(600)))
        .unwrap();
    wait_past(end);
    // Every way of reading answers "absent", never the older value.
    assert_eq!(st.block_on(st.get(b"a")).unwrap(), None);
    assert!(!st.block_on(st.exists(b"b")).unwrap());
    let many = st.block_on(st.get_many(&[b"c", b"long"]));
    assert_eq!(many[0].as_ref().unwrap(), &None);
    assert_eq!(many[1].as_ref().unwrap().as_deref(), Some(&b"stays"[..]));
    let out = Arc::new(
        st.pool()
            .pd()
            .alloc_mr(4096, AccessFlags::LOCAL_WRITE)
            .unwrap(),
    );
    assert_eq!(
        st.block_on(st.get_into(b"d", &Mr::share(&out))).unwrap(),
        None
    );
    let listed = st.block_on(st.list(b"")).unwrap();
    assert_eq!(
        listed,
        vec![b"long".to_vec()],
        "only the live key is listed"
    );
    let stats = st.stats();
    assert!(stats.expired >= 4, "{stats:?}");
    // Each first reader replaced the expired value with a tombstone (its block is freed
    // after the grace period), above it: a get from another client sees it removed.
    assert!(stats.reclaimed >= 4, "{stats:?}");
    for k in ["a", "b", "c", "d"] {
        let at = st.block_on(st.locate(k.as_bytes())).unwrap();
        assert!(
            !at.is_empty() && at.iter().all(|l| l.tombstone),
            "{k}: {at:?}"
        );
    }
    let other = store(&refs, 2, 2);
    assert_eq!(other.block_on(other.get(b"a")).unwrap(), None);
    // A put after it is read as any put.
    other.block_on(other.put(b"a", b"again")).unwrap();
    assert_eq!(
        st.block_on(st.get(b"a")).unwrap().as_deref(),
        Some(&b"again"[..])
    );
    assert_eq!(
        st.block_on(st.get(b"long")).unwrap().as_deref(),
        Some(&b"stays"[..])
    );
}

#[test]
fn a_striped_value_expires_with_its_manifest() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = Store::new(
        pool(&refs, 3),
        StoreConfig {
            replicas: 2,
            part_size: 16 << 10,
            grace: Duration::from_millis(50),
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let big = value(5, 100 << 10);
    let ttl = Duration::from_millis(300);
    st.block_on(st.put_with_ttl(b"big", &big, ttl)).unwrap();
    let end = SystemTime::now() + ttl;
    wait_past(end);
    assert_eq!(st.block_on(st.get(b"big")).unwrap(), None);
    assert!(!st.block_on(st.exists(b"big")).unwrap());
}

#[test]
fn bad_times_to_live_are_typed_errors_and_change_nothing() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = store(&refs, 4, 2);
    st.block_on(st.put(b"k", b"kept")).unwrap();
    // 0, not longer than the clock skew (50 ms by default), past 64-bit milliseconds.
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(50),
        Duration::MAX,
        Duration::from_millis(u64::MAX),
    ] {
        match st.block_on(st.put_with_ttl(b"k", b"new", ttl)) {
            Err(Error::Core(CoreError::OutOfLimits { what, .. })) => {
                assert!(what.contains("time to live"), "{what}")
            }
            other => panic!("{ttl:?}: {other:?}"),
        }
    }
    assert_eq!(
        st.block_on(st.get(b"k")).unwrap().as_deref(),
        Some(&b"kept"[..])
    );
    assert_eq!(st.stats().puts, 1);
}

#[test]
fn a_repair_replaces_expired_values_nobody_read() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = store(&refs, 6, 2);
    let ttl = Duration::from_millis(300);
    for i in 0..5 {
        st.block_on(st.put_with_ttl(format!("gone-{i}").as_bytes(), b"v", ttl))
            .unwrap();
    }
    st.block_on(st.put_with_ttl(b"live", b"w", Duration::from_secs(600)))
        .unwrap();
    let end = SystemTime::now() + ttl;
    wait_past(end);
    let report = st.block_on(st.repair()).unwrap();
    assert_eq!(report.expired, 5, "{report:?}");
    for i in 0..5 {
        let key = format!("gone-{i}");
        let at = st.block_on(st.locate(key.as_bytes())).unwrap();
        assert!(
            !at.is_empty() && at.iter().all(|l| l.tombstone),
            "{key}: {at:?}"
        );
    }
    assert_eq!(st.stats().expired, 0, "no get read them");
    assert_eq!(
        st.block_on(st.get(b"live")).unwrap().as_deref(),
        Some(&b"w"[..])
    );
}
