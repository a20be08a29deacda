//! Issue #40: the repair that runs by itself. One client of the cluster repairs at a time
//! (the repairer word), another takes over when it stops, and a restart is repaired, and
//! removed keys' tombstones cleared, with no repair called by hand.

use super::*;
use rdmapool::store::Repairer;

fn store_with(servers: &[&MemoryServer], id: u64, hold: Duration) -> Arc<Store> {
    let cfg = StoreConfig {
        replicas: 2,
        grace: Duration::from_millis(50),
        tombstone_hold: hold,
        ..StoreConfig::default()
    };
    Arc::new(Store::new(pool(servers, id), cfg).expect("store"))
}

#[test]
fn one_client_repairs_at_a_time_and_another_takes_over_when_it_stops() {
    let lease = Duration::from_secs(10);
    let (s1, s2) = (server(1, lease), server(2, lease));
    let a = store_with(&[&s1, &s2], 41, Duration::from_secs(60));
    let b = store_with(&[&s1, &s2], 42, Duration::from_secs(60));
    let every = Duration::from_millis(100);
    let ra = Repairer::start(a.clone(), every).unwrap();
    let rb = Repairer::start(b.clone(), every).unwrap();
    wait_until("three repairs ran", || {
        ra.stats().runs + rb.stats().runs >= 3
    });
    let (sa, sb) = (ra.stats(), rb.stats());
    assert!(
        (sa.runs == 0) != (sb.runs == 0),
        "exactly one repairs: {sa:?} {sb:?}"
    );
    let (running, waiting) = if sa.runs > 0 { (ra, rb) } else { (rb, ra) };
    assert!(
        waiting.stats().deferred_to_another > 0,
        "{:?}",
        waiting.stats()
    );
    drop(running); // gives the word back
    wait_until("the other client takes over", || waiting.stats().runs > 0);
}

#[test]
fn a_restart_is_repaired_and_tombstones_cleared_with_no_repair_called() {
    let lease = Duration::from_secs(10);
    let s1 = server(1, lease);
    let s2 = server(2, lease);
    let s3 = server(3, lease);
    let hold = Duration::from_millis(300);
    let st = store_with(&[&s1, &s2, &s3], 43, hold);
    let (keys, removed) = (40, 5);
    for i in 0..keys {
        st.block_on(st.put(format!("k{i}").as_bytes(), &value(i, 300)))
            .unwrap();
    }
    for i in 0..removed {
        assert!(st.block_on(st.remove(format!("k{i}").as_bytes())).unwrap());
    }
    let repairer = Repairer::start(st.clone(), Duration::from_millis(200)).unwrap();
    // Node 2 is killed and started again where it was: same id, empty memory.
    let addr2 = s2.addr();
    drop(s2);
    let _s2 = start_again("restart node 2", || server_at(2, lease, addr2));
    wait_until(
        "every key has two replicas again, and no tombstone is left",
        || {
            (0..keys).all(|i| {
                let at = st.block_on(st.locate(format!("k{i}").as_bytes()));
                match at {
                    Ok(at) if i < removed => at.is_empty(),
                    Ok(at) => at.len() == 2,
                    Err(_) => false,
                }
            })
        },
    );
    for i in removed..keys {
        let got = st.block_on(st.get(format!("k{i}").as_bytes())).unwrap();
        assert_eq!(got, Some(value(i, 300)), "k{i}");
    }
    for i in 0..removed {
        assert_eq!(
            st.block_on(st.get(format!("k{i}").as_bytes())).unwrap(),
            None
        );
    }
    assert!(repairer.stats().runs >= 2, "{:?}", repairer.stats());
}

#[test]
fn a_zero_period_is_a_typed_error() {
    let s1 = server(1, Duration::from_secs(10));
    let st = store_with(&[&s1], 44, Duration::from_secs(60));
    let r = Repairer::start(st, Duration::ZERO);
    assert!(
        matches!(r, Err(Error::Core(CoreError::OutOfLimits { .. }))),
        "{:?}",
        r.err()
    );
}
