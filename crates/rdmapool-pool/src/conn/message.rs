//! The TCP connection manager's messages on the CM port (docs/PROTOCOL.md section 4): an
//! 8-byte header (magic, version, kind, body length), then the endpoint and the private data,
//! each with its length. Shared by the handshake (`tcp.rs`) and the port that reads
//! requests (`pending.rs`).

use crate::fabric::private_data::{
    MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA,
};
use crate::fabric::Endpoint;
use crate::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const MAGIC: [u8; 4] = *b"RDCM";
const VERSION: u8 = 1;
pub(super) const REQ: u8 = 1;
pub(super) const REP: u8 = 2;
pub(super) const REJ: u8 = 3;
pub(super) const RTU: u8 = 4;
/// Largest message body accepted on the CM port (after the 8-byte header): endpoint and
/// private data with their lengths.
const MAX_BODY: usize = 2 + Endpoint::MAX_LEN + 2 + MAX_ACCEPT_PRIVATE_DATA;

pub(super) fn io_err(peer: SocketAddr, what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| {
        Error::Core(crate::CoreError::Connection {
            peer: peer.to_string(),
            reason: format!("{what}: {e}"),
        })
    }
}

/// One handshake message: kind, endpoint (REQ/REP) and private data (REQ/REP/REJ).
pub(super) struct Message {
    pub(super) kind: u8,
    pub(super) endpoint: Option<Endpoint>,
    pub(super) private: Vec<u8>,
}

/// Length of a message header.
pub(super) const HEADER_LEN: usize = 8;

impl Message {
    pub(super) fn encode(&self) -> Vec<u8> {
        let ep = self
            .endpoint
            .as_ref()
            .map(Endpoint::to_bytes)
            .unwrap_or_default();
        let body = 2 + ep.len() + 2 + self.private.len();
        let mut b = Vec::with_capacity(8 + body);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(self.kind);
        b.extend_from_slice(&(body as u16).to_le_bytes());
        b.extend_from_slice(&(ep.len() as u16).to_le_bytes());
        b.extend_from_slice(&ep);
        b.extend_from_slice(&(self.private.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.private);
        b
    }

    pub(super) fn read(s: &mut TcpStream, peer: SocketAddr, deadline: Instant) -> Result<Message> {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        s.set_read_timeout(Some(left))
            .map_err(io_err(peer, "setting a timeout"))?;
        let mut h = [0u8; HEADER_LEN];
        s.read_exact(&mut h)
            .map_err(io_err(peer, "reading a CM message"))?;
        let mut b = vec![0u8; Self::body_len(&h)?];
        s.read_exact(&mut b)
            .map_err(io_err(peer, "reading a CM message"))?;
        Self::parse(&h, &b)
    }

    /// The body length a header announces (checked).
    pub(super) fn body_len(h: &[u8; HEADER_LEN]) -> Result<usize> {
        if h[0..4] != MAGIC {
            return Err(bad("bad magic".into()));
        }
        if h[4] != VERSION {
            return Err(bad(format!(
                "version {} (this build speaks {VERSION})",
                h[4]
            )));
        }
        let body = u16::from_le_bytes([h[6], h[7]]) as usize;
        if !(4..=MAX_BODY).contains(&body) {
            return Err(bad(format!("body of {body} bytes")));
        }
        Ok(body)
    }

    /// A message from its header and body.
    pub(super) fn parse(h: &[u8; HEADER_LEN], b: &[u8]) -> Result<Message> {
        let body = b.len();
        let ep_len = u16::from_le_bytes([b[0], b[1]]) as usize;
        let ep_end = 2 + ep_len;
        if ep_end + 2 > body {
            return Err(bad("endpoint length past the end".into()));
        }
        let endpoint = if ep_len > 0 {
            Some(Endpoint::from_bytes(&b[2..ep_end])?)
        } else {
            None
        };
        let pd_len = u16::from_le_bytes([b[ep_end], b[ep_end + 1]]) as usize;
        if ep_end + 2 + pd_len != body {
            return Err(bad("private data length does not match".into()));
        }
        let kind = h[5];
        let max = match kind {
            REQ => MAX_CONNECT_PRIVATE_DATA,
            REP => MAX_ACCEPT_PRIVATE_DATA,
            REJ => MAX_REJECT_PRIVATE_DATA,
            RTU => 0,
            k => return Err(bad(format!("unknown kind {k}"))),
        };
        if pd_len > max {
            return Err(bad(format!(
                "{pd_len} bytes of private data (at most {max})"
            )));
        }
        if matches!(kind, REQ | REP) != endpoint.is_some() {
            return Err(bad("endpoint missing or unexpected".into()));
        }
        Ok(Message {
            kind,
            endpoint,
            private: b[ep_end + 2..].to_vec(),
        })
    }
}

fn bad(reason: String) -> Error {
    Error::Core(crate::CoreError::Malformed {
        what: "connection-manager message",
        reason,
    })
}

pub(super) fn send(s: &mut TcpStream, peer: SocketAddr, m: &Message) -> Result<()> {
    s.write_all(&m.encode())
        .map_err(io_err(peer, "sending a CM message"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc_check::{all_say, section, PROTOCOL};

    /// docs/PROTOCOL.md section 4 states this handshake's version, its body limit (and how
    /// it is made up) and the private data each kind carries: all as the code has them.
    #[test]
    fn protocol_md_states_the_version_and_limits_of_the_cm_port() {
        let s4 = section(PROTOCOL, 4);
        all_say(
            s4,
            "| 4 | 1 | u8 | version = ",
            VERSION.into(),
            "the TCP CM version",
        );
        let row = section(PROTOCOL, 1)
            .lines()
            .find(|l| l.contains("| TCP CM"))
            .expect("section 1 has a row for the TCP CM");
        all_say(row, "Must equal ", VERSION.into(), "the TCP CM version");
        let body = MAX_BODY as u64;
        all_say(s4, "must be in `4..=", body, "MAX_BODY");
        all_say(s4, "`4 <= body <= ", body, "MAX_BODY");
        // How the limit is made up: the lengths' two u16s, the largest endpoint, the largest
        // private data.
        let formula = s4
            .split("(`MAX_BODY = ")
            .nth(1)
            .and_then(|r| r.split('`').next())
            .expect("section 4 spells out MAX_BODY");
        let terms: Vec<usize> = formula.split(" + ").map(|t| t.parse().unwrap()).collect();
        assert_eq!(terms, [2, Endpoint::MAX_LEN, 2, MAX_ACCEPT_PRIVATE_DATA]);
        assert_eq!(terms.iter().sum::<usize>(), MAX_BODY);
        let limits = format!(
            "The {MAX_CONNECT_PRIVATE_DATA}/{MAX_ACCEPT_PRIVATE_DATA}/{MAX_REJECT_PRIVATE_DATA} \
             limits"
        );
        assert!(s4.contains(&limits), "section 4 should say: {limits}");
        all_say(
            s4,
            "endpoint is at most ",
            Endpoint::MAX_LEN as u64,
            "MAX_LEN",
        );
        all_say(
            s4,
            "private data at most ",
            MAX_ACCEPT_PRIVATE_DATA as u64,
            "the largest private data",
        );
        for (kind, max) in [
            ("| REQ (1) | required | ", MAX_CONNECT_PRIVATE_DATA),
            ("| REP (2) | required | ", MAX_ACCEPT_PRIVATE_DATA),
            (
                "| REJ (3) | must be absent (`ep_len = 0`) | ",
                MAX_REJECT_PRIVATE_DATA,
            ),
            ("| RTU (4) | must be absent | ", 0),
        ] {
            all_say(s4, kind, max as u64, kind);
        }
        all_say(
            s4,
            "REQ{endpoint A, pd<=",
            MAX_CONNECT_PRIVATE_DATA as u64,
            "REQ",
        );
        all_say(
            s4,
            "REP{endpoint B, pd<=",
            MAX_ACCEPT_PRIVATE_DATA as u64,
            "REP",
        );
        all_say(
            s4,
            "reject: REJ{pd<=",
            MAX_REJECT_PRIVATE_DATA as u64,
            "REJ",
        );
        // The RTU example: magic, version, kind 4, body 4.
        let rtu = Message {
            kind: RTU,
            endpoint: None,
            private: Vec::new(),
        }
        .encode();
        let hex: Vec<String> = rtu.iter().map(|b| format!("{b:02x}")).collect();
        assert!(
            s4.contains(&format!(
                "an RTU is always these 12 bytes: `{}`",
                hex.join(" ")
            )),
            "section 4's RTU example is not {hex:?}"
        );
    }
}
