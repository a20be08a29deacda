//! The soft NICs' serving loop: one thread per process whatever the number of connections
//! and NICs, and no peer that stops reading stalls anyone else; READ data that leaves over
//! many writes arrives whole.
//!
//! Thread counts are taken in a child process (this binary, re-run with
//! `RDMAPOOL_TEST_CHILD=threads` or `=nics`): other tests' threads would blur them here.

use crate::support::child::Child;
use crate::support::rawpeer::{status, Raw, SoftTarget};
use crate::support::*;
use rdmapool::fabric::*;
use std::time::Duration;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Threads of this process named `rdmapool-soft-serve` (the kernel keeps 15 bytes of a name).
fn serving_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|name| name.trim_end() == "rdmapool-soft-s")
        .count()
}

/// One 8-byte WRITE of `value` from `a` to `b` over `qa`, checked where it lands.
fn write_one(a: &Node, b: &Node, qa: &Qp, value: u64) {
    let dst = b.pd.alloc_mr(64, AccessFlags::all_remote()).unwrap();
    let src = a.pd.alloc_mr(64, AccessFlags::all_remote()).unwrap();
    src.write_at(0, &value.to_le_bytes()).unwrap();
    let sg = [src.sge(0, 8).unwrap()];
    qa.post_send(&[write_wr(value, dst.remote_at(0).unwrap(), &sg)])
        .unwrap();
    assert!(one(&a.cq).is_ok(), "WRITE {value}");
    assert_eq!(contents(&dst)[..8], value.to_le_bytes(), "WRITE {value}");
}

/// The child's side: `threads` connects QP pairs on both paths and reports the thread
/// count of its process before and after; `nics` opens and closes NICs and reports how
/// many serving threads the process has as it goes.
#[test]
fn child_entry() {
    match std::env::var("RDMAPOOL_TEST_CHILD").as_deref() {
        Ok("threads") => many_connections(),
        Ok("nics") => many_nics(),
        _ => {} // an ordinary test run: nothing to do
    }
}

/// Four NICs over TCP serve two QP pairs from one loop; closing two leaves the others
/// served; closing all ends the loop, and the next NIC starts one again.
fn many_nics() {
    let mut nodes: Vec<Node> = (0..4).map(|_| node_on(Transport::Tcp)).collect();
    {
        let (q01, _q10) = pair(&nodes[0], &nodes[1], &config());
        let (q23, _q32) = pair(&nodes[2], &nodes[3], &config());
        write_one(&nodes[0], &nodes[1], &q01, 1);
        write_one(&nodes[2], &nodes[3], &q23, 2);
    }
    let with_four = serving_threads();
    nodes.truncate(2);
    let (q01, _q10) = pair(&nodes[0], &nodes[1], &config());
    write_one(&nodes[0], &nodes[1], &q01, 3);
    drop((q01, _q10));
    drop(nodes);
    // The loop ends on its own thread once it has seen the last NIC close: wait for it (a
    // loop that never ends fails here).
    let mut after_all = serving_threads();
    for _ in 0..1000 {
        if after_all == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        after_all = serving_threads();
    }
    let nodes = [node_on(Transport::Tcp), node_on(Transport::Tcp)];
    let (q, _q) = pair(&nodes[0], &nodes[1], &config());
    write_one(&nodes[0], &nodes[1], &q, 4);
    println!("@{with_four} {after_all} {}", serving_threads());
}

#[test]
fn the_nics_of_a_process_share_one_serving_loop_that_ends_with_the_last() {
    if soft_only("the soft NICs' serving loop") {
        return;
    }
    let mut child = Child::spawn(module_path!(), "nics", &[]);
    let line = child.line();
    // Serving threads with 4 NICs open, with none, with a pair of NICs again (before the
    // loop was shared: 4, 0, 2).
    assert_eq!(line, "1 0 1");
}

fn many_connections() {
    let nodes = [
        (node_on(Transport::Tcp), node_on(Transport::Tcp)),
        (node_on(Transport::Local), node_on(Transport::Local)),
    ];
    // One pair on each path first: every thread a NIC starts is running by then.
    let mut pairs: Vec<(Qp, Qp)> = nodes.iter().map(|(a, b)| pair(a, b, &config())).collect();
    let before = threads();
    for (a, b) in &nodes {
        for _ in 0..100 {
            pairs.push(pair(a, b, &config()));
        }
    }
    // Every connection works (one WRITE on each pair), then count.
    for (i, (qa, _qb)) in pairs.iter().enumerate() {
        let (a, b) = &nodes[if i < 2 { i } else { (i - 2) / 100 }];
        write_one(a, b, qa, i as u64);
    }
    let after = threads();
    println!("@{before} {after} {}", 2 * pairs.len());
}

#[test]
fn threads_stay_flat_from_two_connections_to_four_hundred() {
    if soft_only("the soft NIC's serving loop") {
        return;
    }
    let mut child = Child::spawn(module_path!(), "threads", &[]);
    let line = child.line();
    let n: Vec<usize> = line
        .split(' ')
        .map(|w| w.parse().expect("three numbers"))
        .collect();
    let (before, after, connections) = (n[0], n[1], n[2]);
    assert_eq!(connections, 404, "{line}");
    // Before: a thread per incoming connection (404 more).
    assert_eq!(
        after, before,
        "threads {before} with 4 connections, {after} with {connections}"
    );
}

/// A READ request frame (docs/PROTOCOL.md, section 5.3).
fn read_request(seq: u64, addr: u64, rkey: u32, len: u32) -> [u8; 56] {
    let mut r = [0u8; 56];
    r[0..4].copy_from_slice(b"RDRQ");
    r[4] = 2;
    r[5] = 3;
    r[8..16].copy_from_slice(&seq.to_le_bytes());
    r[16..24].copy_from_slice(&addr.to_le_bytes());
    r[24..28].copy_from_slice(&rkey.to_le_bytes());
    r[28..32].copy_from_slice(&len.to_le_bytes());
    r
}

#[test]
fn a_peer_that_stops_reading_stalls_no_one_else_and_its_reads_arrive_whole() {
    if soft_only("the soft NIC's serving loop") {
        return;
    }
    const LEN: usize = 1 << 20;
    const READS: u64 = 48;
    let (a, b) = (node_on(Transport::Tcp), node_on(Transport::Tcp));
    let region = b.pd.alloc_mr(LEN, AccessFlags::all_remote()).unwrap();
    let data = pattern(LEN, 7);
    region.write_at(0, &data).unwrap();
    // The stuck peer's QP waits two minutes for it to take its answers: a loop that waited
    // on that one socket would starve every other connection of the NIC for that long.
    let patient = QpConfig {
        timeout: Duration::from_secs(120),
        ..config()
    };
    let bound_to = a.pd.create_qp(&a.cq, &a.cq, &config()).unwrap();
    let stuck_qp = b.pd.create_qp(&b.cq, &b.cq, &patient).unwrap();
    stuck_qp.connect(&bound_to.endpoint()).unwrap();
    let target = SoftTarget::of(&stuck_qp.endpoint());
    let mut raw = Raw::tcp(&target);
    let st = raw
        .hello(bound_to.qpn(), target.qpn, &target.token, None)
        .unwrap();
    assert_eq!(st, status::OK);
    // 48 MiB of READs asked for at once, and not one byte read back yet: far more than the
    // socket buffers hold.
    let remote = region.remote_at(0).unwrap();
    let mut asks = Vec::new();
    for seq in 0..READS {
        asks.extend_from_slice(&read_request(seq, remote.addr, remote.rkey, LEN as u32));
    }
    raw.send(&asks).unwrap();
    std::thread::sleep(Duration::from_millis(300)); // let its answers fill the socket

    // Meanwhile, new connections to the same NIC are taken and served.
    for round in 0..3u8 {
        let (qa, _qb) = pair(&a, &b, &config());
        let dst = b.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
        let src = a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
        src.write_at(0, &pattern(4096, round)).unwrap();
        let sg = [src.sge(0, 4096).unwrap()];
        qa.post_send(&[write_wr(1, dst.remote_at(0).unwrap(), &sg)])
            .unwrap();
        assert!(
            one(&a.cq).is_ok(),
            "round {round}: a WRITE beside the stuck peer"
        );
        let back = a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
        let sg = [back.sge(0, 4096).unwrap()];
        qa.post_send(&[read_wr(2, dst.remote_at(0).unwrap(), &sg)])
            .unwrap();
        assert!(
            one(&a.cq).is_ok(),
            "round {round}: a READ beside the stuck peer"
        );
        assert_eq!(contents(&back), pattern(4096, round));
    }
    // The stuck peer starts reading: every answer is there, in order, whole, though each
    // left in many pieces as the socket took them.
    for seq in 0..READS {
        let hdr = raw.recv(32).unwrap();
        assert_eq!(&hdr[0..4], b"RDRS");
        assert_eq!(hdr[5], 2, "READ {seq}: a data response");
        assert_eq!(u64::from_le_bytes(hdr[8..16].try_into().unwrap()), seq);
        assert_eq!(
            u32::from_le_bytes(hdr[16..20].try_into().unwrap()),
            LEN as u32
        );
        let got = raw.recv(LEN).unwrap();
        assert!(got == data, "READ {seq}: the data differs");
    }
    assert_eq!(stuck_qp.state(), QpState::Rts);
}
