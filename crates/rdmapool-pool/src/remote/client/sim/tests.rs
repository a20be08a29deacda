//! The schedules: a property test over random ones, and two written out.

use super::*;

/// Runs one schedule: each action is (what, which client or how long).
fn run(lease_ms: u64, clients: u64, actions: &[(u8, u8)]) -> Cluster {
    let mut c = Cluster::new(lease_ms, clients);
    let n = c.clients.len();
    for &(what, arg) in actions {
        let i = arg as usize % n;
        match what {
            0..=29 => c.advance(1 + u64::from(arg) % (lease_ms / 2).max(1)),
            30..=199 => c.step(i, arg / 4),
            200..=219 => c.advance(1),
            220..=229 => c.clients[i].frozen_until = c.now + u64::from(arg) * lease_ms / 64,
            230..=233 => c.clients[i].lose_next = true,
            234..=237 => c.clients[i].stalled_until = c.now + u64::from(arg) * lease_ms / 128,
            238..=245 => c.crash(i),
            246..=255 if arg % 4 == 0 => c.restart_server(),
            _ => c.advance(1),
        }
    }
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    /// Whatever the interleaving, freezes, crashes, lost answers and server restarts, no
    /// client ever finds another's bytes in an object it holds, no object goes to two
    /// clients that may use it, recovery finds exactly what the predecessor held, and old
    /// pointers are refused after a server restart (the oracle is in the module docs).
    #[test]
    fn the_pool_never_hands_back_the_wrong_bytes(
        lease_ms in 40u64..400,
        clients in 2u64..=4,
        actions in proptest::collection::vec(any::<(u8, u8)>(), 50..1000),
    ) {
        run(lease_ms, clients, &actions);
    }
}

#[test]
fn two_clients_filling_the_node_get_disjoint_objects() {
    // Without faults: allocations until the node is full, from two clients at once, and
    // every object checked after.
    let mut actions = Vec::new();
    for k in 0..3000u32 {
        actions.push((100, (k % 2) as u8 | (4 * ((k % 7) as u8 * 3))));
        if k % 50 == 0 {
            actions.push((200, 0));
        }
    }
    let c = run(200, 2, &actions);
    let held: usize = c.clients.iter().map(|c| c.held.len()).sum();
    assert!(held > 100, "only {held} allocations made");
}

#[test]
fn a_client_frozen_past_its_lease_loses_everything_and_others_reuse_it() {
    // Client 7 allocates, freezes for three leases; the server expires it and client 14
    // allocates in the space freed; 7 wakes, stops, restarts and recovers nothing.
    let mut c = Cluster::new(100, 2);
    for _ in 0..40 {
        c.step(0, 0);
        c.step(1, 0);
        c.advance(1);
    }
    assert!(matches!(c.clients[0].life, Life::Up), "client 7 joined");
    for k in 0..200u8 {
        c.step(0, (k % 2) * 3 * 4);
        c.advance(1);
    }
    let had = c.clients[0].held.len();
    assert!(had > 0);
    c.clients[0].frozen_until = c.now + 300;
    c.advance(300);
    assert_eq!(c.expiries.get(&7), Some(&1), "{:#?}", c.log);
    // Woken, its first renewal finds the heartbeat zeroed: it stops.
    assert!(matches!(c.clients[0].life, Life::Down), "{:#?}", c.log);
    for _ in 0..400 {
        c.step(1, 12);
        c.advance(1);
    }
    for _ in 0..200 {
        c.step(0, 2);
        c.advance(1);
    }
    assert!(matches!(c.clients[0].life, Life::Up));
    assert!(c.clients[0].held.is_empty(), "recovered after expiry");
}
