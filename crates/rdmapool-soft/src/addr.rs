//! How a soft context is reached: host identity, TCP address and local socket path.

use super::proto::handshake::TOKEN_LEN;
use crate::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;

/// The address part of a soft [`crate::fabric::Endpoint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftAddress {
    /// Identifies the host (its boot id): equal ids mean the intra-host path can be used.
    pub host_id: [u8; 16],
    /// The QP's secret token: a connection to it must prove it knows this (the hello's MAC).
    /// All zero in a context's own address, which names no QP.
    pub token: [u8; TOKEN_LEN],
    /// The context's TCP listener.
    pub tcp: SocketAddr,
    /// The context's local (Unix) socket: `@name` for a name in the abstract namespace
    /// (nothing on disk, gone with the process), else a path.
    pub local: String,
}

/// This host's identity: the kernel's boot id, or a per-process random id if unreadable.
pub fn host_id() -> [u8; 16] {
    static ID: OnceLock<[u8; 16]> = OnceLock::new();
    *ID.get_or_init(|| {
        let mut id = [0u8; 16];
        if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
            let hex: String = s.trim().chars().filter(|c| *c != '-').collect();
            if let Ok(b) = crate::util::hex_decode(&hex) {
                if b.len() == 16 {
                    id.copy_from_slice(&b);
                    return id;
                }
            }
        }
        let _ = getrandom::fill(&mut id);
        id
    })
}

impl SoftAddress {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.local.len());
        b.extend_from_slice(&self.host_id);
        b.extend_from_slice(&self.token);
        match self.tcp.ip() {
            IpAddr::V4(v4) => {
                b.push(4);
                b.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                b.push(6);
                b.extend_from_slice(&v6.octets());
            }
        }
        b.extend_from_slice(&self.tcp.port().to_le_bytes());
        b.extend_from_slice(&(self.local.len() as u16).to_le_bytes());
        b.extend_from_slice(self.local.as_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let bad = |r: &str| Error::Malformed {
            what: "soft endpoint address",
            reason: r.into(),
        };
        let mut host_id = [0u8; 16];
        host_id.copy_from_slice(b.get(..16).ok_or_else(|| bad("truncated host id"))?);
        let mut token = [0u8; TOKEN_LEN];
        token.copy_from_slice(b.get(16..32).ok_or_else(|| bad("truncated token"))?);
        let b = &b[32..];
        let (ip, rest): (IpAddr, &[u8]) = match b.first() {
            Some(4) => {
                let o: [u8; 4] = b
                    .get(1..5)
                    .ok_or_else(|| bad("truncated IPv4"))?
                    .try_into()
                    .unwrap();
                (Ipv4Addr::from(o).into(), &b[5..])
            }
            Some(6) => {
                let o: [u8; 16] = b
                    .get(1..17)
                    .ok_or_else(|| bad("truncated IPv6"))?
                    .try_into()
                    .unwrap();
                (Ipv6Addr::from(o).into(), &b[17..])
            }
            _ => return Err(bad("unknown address family")),
        };
        if rest.len() < 4 {
            return Err(bad("truncated port"));
        }
        let port = u16::from_le_bytes([rest[0], rest[1]]);
        let len = u16::from_le_bytes([rest[2], rest[3]]) as usize;
        if rest.len() != 4 + len {
            return Err(bad("local path length mismatch"));
        }
        let local = String::from_utf8(rest[4..].to_vec()).map_err(|_| bad("path not UTF-8"))?;
        Ok(Self {
            host_id,
            token,
            tcp: SocketAddr::new(ip, port),
            local,
        })
    }
}
