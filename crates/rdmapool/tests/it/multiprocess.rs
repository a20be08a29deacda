//! Two real processes: opcodes across them, a peer killed or frozen mid-stream, malformed
//! frames from a raw socket, and the locked-memory limit in a process that lacks
//! CAP_IPC_LOCK.
//!
//! The child side is this same test binary, re-run with `RDMAPOOL_TEST_CHILD` set so that
//! only `child_entry` does anything. Lines starting with `@` are the protocol between them.

use crate::support::child::{parent_line as stdin_line, Child as Peer};
use crate::support::*;
use rdmapool::fabric::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

mod failures;
mod memlock;
mod paths;
mod roles;

/// This module, for child processes started with its `child_entry`.
const HERE: &str = module_path!();

const ALL: AccessFlags = AccessFlags::all_remote();
const REGION: usize = 1 << 20;

/// The child's side. Roles: `target` (exports a region, serves until told to stop),
/// `writer` (connects and writes into the parent's region forever), `memlock` (lowers its
/// locked-memory limit, drops root, and reports what registration does).
#[test]
fn child_entry() {
    roles::run();
}

/// Parent initiator against a child target: every opcode, verified.
fn connect_to_target(t: Transport) -> (Peer, Node, Qp, RemoteRegion) {
    let mut peer = Peer::spawn(
        module_path!(),
        "target",
        &[("T", if t == Transport::Tcp { "tcp" } else { "local" })],
    );
    let first = peer.line();
    let (ep, region) = first.split_once(' ').unwrap();
    let remote_ep = Endpoint::from_hex(ep).unwrap();
    let region = RemoteRegion::from_hex(region).unwrap();
    let n = node_on(t);
    let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
    qp.modify_to_init().unwrap();
    peer.say(&qp.endpoint().to_hex());
    assert_eq!(peer.line(), "ready");
    qp.modify_to_rtr(&remote_ep).unwrap();
    qp.modify_to_rts().unwrap();
    (peer, n, qp, region)
}

/// A target process connected over TCP (`n` must take TCP) and then frozen (SIGSTOP): its
/// socket stays open and nothing answers. Returns the child (continue it when done), the QP
/// and the region.
fn frozen_target(n: &Node, timeout: Duration) -> (Peer, Qp, RemoteRegion) {
    let mut peer = Peer::spawn(module_path!(), "target", &[("T", "tcp")]);
    let first = peer.line();
    let (ep, region) = first.split_once(' ').unwrap();
    let region = RemoteRegion::from_hex(region).unwrap();
    let cfg = QpConfig {
        timeout,
        ..config()
    };
    let qp = n.pd.create_qp(&n.cq, &n.cq, &cfg).unwrap();
    qp.modify_to_init().unwrap();
    peer.say(&qp.endpoint().to_hex());
    assert_eq!(peer.line(), "ready");
    qp.modify_to_rtr(&Endpoint::from_hex(ep).unwrap()).unwrap();
    qp.modify_to_rts().unwrap();
    peer.signal(libc::SIGSTOP);
    // Wait until the kernel reports it stopped (state T in /proc/PID/stat).
    let stat = format!("/proc/{}/stat", peer.pid());
    let until = Instant::now() + WAIT;
    while !std::fs::read_to_string(&stat).unwrap().contains(") T ") {
        assert!(Instant::now() < until, "child never stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
    (peer, qp, region)
}

/// A request frame: WRITE of `len` bytes at `addr` with `rkey`.
fn write_request(addr: u64, rkey: u32, len: u32) -> [u8; 56] {
    let mut b = [0u8; 56];
    b[0..4].copy_from_slice(b"RDRQ");
    b[4] = 2;
    b[5] = 2;
    b[16..24].copy_from_slice(&addr.to_le_bytes());
    b[24..28].copy_from_slice(&rkey.to_le_bytes());
    b[28..32].copy_from_slice(&len.to_le_bytes());
    b
}

/// True when the peer closed the connection (EOF or reset) within the wait.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // e.g. the hello acknowledgement
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// A target QP in RTS (bound to a throwaway peer's QP) and a raw connection to it that
/// passed the handshake as that peer, ready to send requests by hand.
fn authenticated_raw(target: &Node, peer: &Node) -> (Qp, Qp, TcpStream) {
    let qp = target
        .pd
        .create_qp(&target.cq, &target.cq, &config())
        .unwrap();
    let pq = peer.pd.create_qp(&peer.cq, &peer.cq, &config()).unwrap();
    qp.connect(&pq.endpoint()).unwrap();
    let t = rawpeer::SoftTarget::of(&qp.endpoint());
    let mut raw = rawpeer::Raw::tcp(&t);
    let st = raw.hello(pq.qpn(), t.qpn, &t.token, None).unwrap();
    assert_eq!(st, rawpeer::status::OK);
    match raw {
        rawpeer::Raw::Tcp(s) => (qp, pq, s),
        rawpeer::Raw::Unix(_) => unreachable!(),
    }
}

/// RLIMIT_MEMLOCK of an ordinary account (`ulimit -l` 8192 KiB), the budget the README
/// promises is enough.
const ORDINARY_MEMLOCK: u64 = 8 << 20;

/// Waits until the kernel reports the child stopped (state T in /proc/PID/stat).
fn wait_stopped(peer: &Peer) {
    let stat = format!("/proc/{}/stat", peer.pid());
    let until = Instant::now() + WAIT;
    while !std::fs::read_to_string(&stat).unwrap().contains(") T ") {
        assert!(Instant::now() < until, "child never stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What the child target sees in its own region.
fn peer_dump(peer: &mut Peer, offset: usize, len: usize) -> Vec<u8> {
    peer.say(&format!("dump {offset} {len}"));
    let line = peer.line();
    let hex = line.strip_prefix("dump ").expect("a dump line");
    (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// Two network namespaces joined by a veth pair: two "hosts" on this machine.
struct TwoHosts {
    a: String,
    b: String,
    addr_a: String,
    addr_b: String,
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl TwoHosts {
    /// None (with the reason) where namespaces cannot be made: not root, or no `ip`.
    fn new() -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        if !sh(&["ip", "-V"]) {
            return Err("iproute2's ip not installed".into());
        }
        let id = std::process::id();
        let (a, b) = (format!("rdmapool-a-{id}"), format!("rdmapool-b-{id}"));
        let subnet = format!("10.{}.{}", 200 + id % 50, (id / 50) % 250);
        let (addr_a, addr_b) = (format!("{subnet}.1"), format!("{subnet}.2"));
        let (va, vb) = (format!("rpa{}", id % 100000), format!("rpb{}", id % 100000));
        let hosts = TwoHosts {
            a,
            b,
            addr_a,
            addr_b,
        };
        let ok = sh(&["ip", "netns", "add", &hosts.a])
            && sh(&["ip", "netns", "add", &hosts.b])
            && sh(&[
                "ip", "link", "add", &va, "type", "veth", "peer", "name", &vb,
            ])
            && sh(&["ip", "link", "set", &va, "netns", &hosts.a])
            && sh(&["ip", "link", "set", &vb, "netns", &hosts.b])
            && sh(&[
                "ip",
                "-n",
                &hosts.a,
                "addr",
                "add",
                &format!("{}/24", hosts.addr_a),
                "dev",
                &va,
            ])
            && sh(&[
                "ip",
                "-n",
                &hosts.b,
                "addr",
                "add",
                &format!("{}/24", hosts.addr_b),
                "dev",
                &vb,
            ])
            && sh(&["ip", "-n", &hosts.a, "link", "set", &va, "up"])
            && sh(&["ip", "-n", &hosts.b, "link", "set", &vb, "up"])
            && sh(&["ip", "-n", &hosts.a, "link", "set", "lo", "up"])
            && sh(&["ip", "-n", &hosts.b, "link", "set", "lo", "up"]);
        if ok {
            Ok(hosts)
        } else {
            Err("creating network namespaces failed".into())
        }
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and so the pair.
        sh(&["ip", "netns", "del", &self.a]);
        sh(&["ip", "netns", "del", &self.b]);
    }
}
