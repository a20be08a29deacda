//! Real faults between real hosts: two network namespaces joined by a user-space relay that
//! loses, delays, reorders and duplicates IP packets or cuts the link (support/faultnet.rs), with
//! target and initiator processes on either side using the soft provider over TCP. Every
//! operation completes or fails with a typed error; nothing hangs (each child is read under a
//! watchdog); data is checked by checksums, and the targets' own view of their memory is
//! compared with what the initiators last wrote; the surviving processes' pinned bytes, open
//! fds, threads and live QPs return to where they started.
//!
//! Needs root and iproute2 (CI has both); elsewhere it says why it skips. Run with
//! `--nocapture` to see the summary line of each scenario.

mod procs;
mod raw;
mod roles;

mod harness;

use crate::support::faultnet::Faults;
use harness::*;
use procs::*;
use rdmapool::fabric::Endpoint;
use std::io::Write;
use std::time::Instant;

#[test]
fn child_entry() {
    match std::env::var("RDMAPOOL_TEST_CHILD").as_deref() {
        Ok("target") => roles::target(),
        Ok("workload") => roles::workload(),
        _ => {}
    }
}

#[test]
fn lossy_link_data_path_and_remote_pool() {
    let Some(net) = net("rfl", 11) else { return };
    net.set(lossy());
    let mut t = target(&net, "target", true, &[]);
    let cm = t.cm.clone();
    let mut w = workload(
        &net,
        "initiator",
        &[&cm, &cm],
        t.pool.as_deref(),
        &[("SEED", "5".into())],
    );
    // Two runs: a connection that failed to come up in the first is retried in the second.
    let (d1, d2) = (run(&mut w, 60), run(&mut w, 60));
    let c = net.counts();
    assert!(
        c.dropped > 0 && c.duplicated > 0 && c.reordered > 0 && c.delayed > 0,
        "{c}"
    );
    assert!(d2.completed > 0 && d2.verified > 0, "{d2:?}");
    let compared = cross_check(&mut w, &mut [&mut t], &[Some(0), Some(0)]);
    assert!(compared > 0);
    let lw = levels(&mut w, "close");
    let lt = forget_and_settle(&mut t);
    let extra = format!("blocks cross-checked={compared}; {lw}; {lt}");
    summary("lossy link", &[&d1, &d2], &net, &extra);
}

#[test]
fn a_killed_initiator_leaves_the_target_and_the_other_initiator_intact() {
    let Some(net) = net("rfi", 14) else { return };
    net.set(mild());
    let mut t = target(&net, "target", true, &[]);
    let cm = t.cm.clone();
    let pool = t.pool.clone();
    let mut doomed = workload(
        &net,
        "doomed-initiator",
        &[&cm],
        pool.as_deref(),
        &[("SEED", "8".into())],
    );
    let other = [("SEED", "9".to_string()), ("SLOT0", "128".to_string())];
    let mut w = workload(&net, "initiator", &[&cm], pool.as_deref(), &other);
    doomed.say("run 1000000");
    doomed.expect("streaming");
    let d = run_with(&mut w, 200, || doomed.kill9());
    assert_eq!(d.failed, 0, "the other initiator saw nothing: {d:?}");
    // The target gets back everything the killed initiator held (its pool lease expires).
    let compared = wrap_up("killed initiator", &mut w, &mut t, &[&d], &net, "");
    assert!(compared > 0);
}

#[test]
fn a_frozen_target_times_out_typed_and_a_peer_that_never_reads_is_cut_off() {
    let Some(net) = net("rfs", 15) else { return };
    net.set(mild());
    let mut t = target(&net, "target", true, &[short()]);
    let cm = t.cm.clone();
    let mut w = workload(
        &net,
        "initiator",
        &[&cm],
        t.pool.as_deref(),
        &[short(), ("SEED", "10".into())],
    );
    let before = run(&mut w, 10);
    assert_eq!(before.failed, 0, "{before:?}");
    t.p.signal(libc::SIGSTOP);
    t.p.wait_stopped();
    let frozen = run(&mut w, 2);
    t.p.signal(libc::SIGCONT);
    assert_eq!(
        frozen.completed, 0,
        "a stopped process answers nothing: {frozen:?}"
    );
    assert!(
        frozen.count("RetryExcErr") > 0 && frozen.count("NodeDown") > 0,
        "{frozen:?}"
    );
    // A raw peer completes the hello, asks for far more READ data than the sockets
    // buffer, and never reads: the target gives up on that connection alone.
    t.p.say("peer 1");
    let peer = t.p.expect("peer");
    let p: Vec<&str> = peer.split_whitespace().collect();
    let ep = p[0].to_string();
    let addr = crate::support::rawpeer::SoftTarget::of(&Endpoint::from_hex(&ep).unwrap()).tcp;
    let (base, rkey) = (
        u64::from_str_radix(p[1], 16).unwrap(),
        p[2].parse().unwrap(),
    );
    let mut s = raw::dial(&net.ns_b, addr);
    raw::soft_hello(&mut s, &ep).expect("the hello is accepted");
    // All 32 requests in one write, so that the target has read every byte the peer sent
    // by the time it gives up: its close then has nothing unread to turn into a reset, and
    // a plain FIN would wait behind the responses the peer never takes.
    let reqs: Vec<u8> = (0..32u64)
        .flat_map(|i| raw::request(3, i, base + (i % 4) * (1 << 20), rkey, 1 << 20))
        .collect();
    s.write_all(&reqs).unwrap();
    let after = run(&mut w, 20);
    assert!(after.completed > 0 && after.verified > 0, "{after:?}");
    assert!(
        raw::closed_by_peer(&s),
        "the target still serves a peer that never reads"
    );
    drop(s);
    let done = [&before, &frozen, &after];
    wrap_up(
        "frozen target, non-reading peer",
        &mut w,
        &mut t,
        &done,
        &net,
        "",
    );
}

#[test]
fn garbage_after_a_valid_handshake_closes_that_connection_only() {
    let Some(net) = net("rfg", 16) else { return };
    net.set(mild());
    let mut t = target(&net, "target", true, &[]);
    let cm = t.cm.clone();
    let mut w = workload(
        &net,
        "initiator",
        &[&cm],
        t.pool.as_deref(),
        &[("SEED", "11".into())],
    );
    let first = run(&mut w, 10);
    t.p.say("peer 4");
    let peer = t.p.expect("peer");
    let p: Vec<&str> = peer.split_whitespace().collect();
    let eps: Vec<String> = p[0].split(',').map(String::from).collect();
    let addr = crate::support::rawpeer::SoftTarget::of(&Endpoint::from_hex(&eps[0]).unwrap()).tcp;
    let (base, rkey) = (
        u64::from_str_radix(p[1], 16).unwrap(),
        p[2].parse().unwrap(),
    );
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "random bytes",
            (0..200u32).map(|i| (i * 97 + 13) as u8).collect(),
        ),
        (
            "a bad magic",
            [&[0u8; 4][..], &raw::request(2, 0, base, rkey, 0)[4..]].concat(),
        ),
        (
            "an unknown opcode",
            raw::request(99, 0, base, rkey, 0).to_vec(),
        ),
        (
            "a length over the maximum",
            raw::request(2, 0, base, rkey, u32::MAX).to_vec(),
        ),
    ];
    let mut closed = 0;
    let d = run_with(&mut w, 100, || {
        for ((what, bytes), ep) in cases.iter().zip(&eps) {
            let mut s = raw::dial(&net.ns_b, addr);
            raw::soft_hello(&mut s, ep).expect("the hello is accepted");
            s.write_all(bytes).unwrap();
            assert!(raw::closed_by_peer(&s), "{what}: connection left open");
            closed += 1;
        }
    });
    assert_eq!(
        (first.failed, d.failed),
        (0, 0),
        "the initiator saw nothing: {d:?}"
    );
    let note = format!("garbage connections closed={closed}; ");
    let compared = wrap_up(
        "garbage after hello",
        &mut w,
        &mut t,
        &[&first, &d],
        &net,
        &note,
    );
    assert!(compared > 0);
}

#[test]
fn a_partition_longer_than_the_qp_timeout_fails_typed_and_heals() {
    let Some(net) = net("rfp", 12) else { return };
    net.set(mild());
    let mut t = target(&net, "target", true, &[short()]);
    let cm = t.cm.clone();
    let env = [short(), ("SEED", "6".into())];
    let mut w = workload(&net, "initiator", &[&cm], t.pool.as_deref(), &env);
    let before = run(&mut w, 20);
    assert!(before.completed > 0 && before.failed == 0, "{before:?}");
    net.partition(true);
    let cut = Instant::now();
    let during = run(&mut w, 2);
    let held = cut.elapsed();
    net.partition(false);
    assert_eq!(
        during.completed, 0,
        "nothing crosses a partition: {during:?}"
    );
    assert!(
        during.count("RetryExcErr") > 0,
        "the QP timed out: {during:?}"
    );
    assert!(
        during.count("NodeDown") > 0,
        "the pool node is down: {during:?}"
    );
    assert!(net.counts().partitioned > 0);
    let after = run(&mut w, 20);
    assert!(
        after.completed > 0 && after.verified > 0,
        "a new connection works: {after:?}"
    );
    let note = format!("partition held {held:.1?}; ");
    let done = [&before, &during, &after];
    let compared = wrap_up("partition", &mut w, &mut t, &done, &net, &note);
    assert!(compared > 0);
}

#[test]
fn an_idle_peer_behind_a_partition_is_noticed_by_keepalive_and_reconnects() {
    // No operation is in flight when the link goes: nothing of the initiator's times out,
    // so only TCP keepalive on the target's accepted connection (10 s idle, 3 probes 2 s
    // apart) can tell the target that its peer is gone.
    let Some(net) = net("rfa", 19) else { return };
    let mut t = target(&net, "target", false, &[]);
    let cm = t.cm.clone();
    let env = [("SEED", "13".to_string())];
    let mut w = workload(&net, "initiator", &[&cm], None, &env);
    let before = run(&mut w, 10);
    assert!(before.completed > 0 && before.failed == 0, "{before:?}");
    net.partition(true);
    // Bounded well past the 16 s keepalive gives up after (a bound on a hang, not a speed).
    t.p.say("gone 60");
    let gone = t.p.expect("gone");
    let dropped = net.counts().partitioned;
    net.partition(false);
    let n: Vec<&str> = gone.split_whitespace().collect();
    assert!(
        n[0] == n[2] && n[0] != "0",
        "every accepted QP heard that its peer is gone, with no FIN: {gone}"
    );
    assert!(dropped > 0, "the keepalive probes met the partition");
    // Healed: the initiator's old connection is refused by the target's host (it forgot
    // it), so its next operation fails typed; the run after that connects anew and works.
    let refused = run(&mut w, 2);
    assert!(
        refused.count("RetryExcErr") + refused.count("WrFlushErr") > 0,
        "the connection the target gave up on fails typed: {refused:?}"
    );
    let after = run(&mut w, 20);
    assert!(
        after.completed > 0 && after.verified > 0,
        "a new connection works: {after:?}"
    );
    let note = format!("target: {gone}; ");
    let done = [&before, &refused, &after];
    let compared = wrap_up(
        "idle peer behind a partition",
        &mut w,
        &mut t,
        &done,
        &net,
        &note,
    );
    assert!(compared > 0);
}

#[test]
fn a_killed_target_fails_its_connection_typed_and_leaves_the_other_intact() {
    let Some(net) = net("rfk", 13) else { return };
    net.set(mild());
    let mut doomed = target(&net, "doomed-target", false, &[]);
    let mut t = target(&net, "target", true, &[]);
    let (c1, c2) = (doomed.cm.clone(), t.cm.clone());
    let env = [("SEED", "7".to_string())];
    let mut w = workload(&net, "initiator", &[&c1, &c2], t.pool.as_deref(), &env);
    let d = run_with(&mut w, 200, || doomed.p.kill9());
    // Whichever the initiator's NIC noticed first: its request connection breaking
    // (RETRY_EXC_ERR), or the target's connection to it ending, which moves the QP to ERR
    // (WR_FLUSH_ERR, and a PeerDisconnected event).
    assert!(
        d.count("RetryExcErr") + d.count("WrFlushErr") > 0,
        "the dead target's connection failed: {d:?}"
    );
    let pool_errors = ["alloc", "pwrite", "pread", "cas", "faa", "free"];
    let pool_failed: u64 = pool_errors.iter().map(|k| d.count(k)).sum();
    assert_eq!(
        pool_failed, 0,
        "the pool on the live target was untouched: {d:?}"
    );
    // Reconnecting to the dead host is refused with a typed error; the other goes on.
    let again = run(&mut w, 20);
    assert!(again.count("connect.Connection") > 0, "{again:?}");
    assert!(again.completed > 0, "{again:?}");
    // Connection 1 (to the live target) holds exactly what was last written.
    let compared = cross_check(&mut w, &mut [&mut t], &[None, Some(0)]);
    assert!(compared > 0);
    let lw = levels(&mut w, "close");
    let extra = format!("blocks cross-checked={compared}; {lw}");
    summary("killed target", &[&d, &again], &net, &extra);
}

#[test]
fn a_long_round_trip_link_still_connects() {
    // 2 x 60 ms of delay, as between distant hosts: the CM handshake's last message arrives
    // well after the acceptor's polling interval (100 ms for the memory server).
    let Some(net) = net("rfw", 17) else { return };
    net.set(Faults {
        delay_ms: 60,
        ..Faults::default()
    });
    let mut t = target(&net, "target", true, &[]);
    let cm = t.cm.clone();
    let env = [("SEED", "12".to_string())];
    let mut w = workload(&net, "initiator", &[&cm], t.pool.as_deref(), &env);
    let d = run(&mut w, 8);
    assert_eq!(d.failed, 0, "every connect and operation works: {d:?}");
    wrap_up("long round trip", &mut w, &mut t, &[&d], &net, "");
}

#[test]
fn a_frozen_initiator_learns_that_its_pool_lease_expired() {
    let Some(net) = net("rfe", 18) else { return };
    net.set(mild());
    let mut t = target(&net, "target", true, &[]);
    let env = [("SEED", "13".to_string())];
    let mut w = workload(&net, "initiator", &[], t.pool.as_deref(), &env);
    let d = run(&mut w, 10);
    assert_eq!(d.failed, 0, "{d:?}");
    // Frozen past its lease, the client cannot renew: the server takes its chunks back.
    w.signal(libc::SIGSTOP);
    w.wait_stopped();
    let until = Instant::now() + WATCHDOG;
    loop {
        t.p.say("expired");
        if t.p.expect("expired") != "0" {
            break;
        }
        assert!(
            Instant::now() < until,
            "the server never expired the frozen client"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    w.signal(libc::SIGCONT);
    // Awake again, it must find out (at its next renewal) instead of using chunks that are
    // no longer its own.
    let (mut early, until) = (0, Instant::now() + WATCHDOG);
    let reason = loop {
        w.say("probe");
        let r = w.expect("probe");
        if r != "ok" {
            break r;
        }
        early += 1;
        assert!(
            Instant::now() < until,
            "the client never noticed its lease was gone"
        );
    };
    // "lease lost" at its next renewal (an operation that was in flight while it was frozen
    // may time out first: the same typed error with that reason).
    assert!(reason.contains("is down"), "a typed NodeDown: {reason}");
    let lw = levels(&mut w, "close");
    let lt = forget_and_settle(&mut t);
    let extra = format!("probes before it noticed={early}: {reason}; {lw}; {lt}");
    summary("frozen initiator, lease expired", &[&d], &net, &extra);
}
