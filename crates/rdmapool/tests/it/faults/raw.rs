//! Misbehaving peers on raw TCP sockets. The soft data connection's handshake is built in
//! one place, [`soft_hello`] (docs/PROTOCOL.md section 5.2, with `crate::support::rawpeer`), so a change to it is a change
//! here only; requests follow section 5.3.

use super::procs::WATCHDOG;
use crate::support::faultnet::FaultNet;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Says the soft data connection's authenticated hello (challenge, MAC) to the QP whose
/// endpoint is `ep_hex`, as that QP's bound peer (itself); Err if the target refused.
pub fn soft_hello(s: &mut TcpStream, ep_hex: &str) -> std::io::Result<()> {
    let ep = rdmapool::fabric::Endpoint::from_hex(ep_hex).unwrap();
    let t = crate::support::rawpeer::SoftTarget::of(&ep);
    s.set_read_timeout(Some(WATCHDOG))?;
    let mut raw = crate::support::rawpeer::Raw::Tcp(s.try_clone()?);
    // The children's NICs hold the test's pre-shared key (they listen beyond loopback).
    let psk = crate::support::test_key_bytes();
    match raw.hello(t.qpn, t.qpn, &t.token, Some(&psk))? {
        0 => Ok(()),
        st => Err(std::io::Error::other(format!("hello refused: status {st}"))),
    }
}

/// A request frame (opcode 2 WRITE, 3 READ).
pub fn request(op: u8, seq: u64, addr: u64, rkey: u32, len: u32) -> [u8; 56] {
    let mut b = [0u8; 56];
    b[0..4].copy_from_slice(b"RDRQ");
    b[4] = 2;
    b[5] = op;
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&addr.to_le_bytes());
    b[24..28].copy_from_slice(&rkey.to_le_bytes());
    b[28..32].copy_from_slice(&len.to_le_bytes());
    b
}

/// A TCP connection to `addr` made from inside namespace `ns`.
pub fn dial(ns: &str, addr: SocketAddr) -> TcpStream {
    FaultNet::in_ns(ns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(20)).expect("raw TCP connect")
    })
}

/// Waits (bounded) until the peer has closed or reset the connection, without reading a
/// byte of what it sent (a reader would relieve a peer blocked on sending). True if it did.
pub fn closed_by_peer(s: &TcpStream) -> bool {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd on our stack.
    let n = unsafe { libc::poll(&mut p, 1, WATCHDOG.as_millis() as i32) };
    n == 1 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}
