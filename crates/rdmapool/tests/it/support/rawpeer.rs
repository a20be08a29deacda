//! A raw soft-provider peer that speaks the documented bytes (docs/PROTOCOL.md, sections 5
//! and 6) by hand: what an attacker on the network or on this host can send.
#![allow(dead_code)]

use hmac::{Hmac, Mac};
use rdmapool::fabric::Endpoint;
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::time::Duration;

/// What a soft endpoint's address carries (section 5.9).
#[derive(Debug, Clone)]
pub struct SoftTarget {
    pub qpn: u32,
    pub token: [u8; 16],
    pub tcp: SocketAddr,
    /// `@name` (abstract) or a path.
    pub local: String,
}

impl SoftTarget {
    pub fn of(ep: &Endpoint) -> Self {
        let b = ep.to_bytes();
        let qpn = u32::from_le_bytes(b[4..8].try_into().unwrap());
        let a = &b[10..];
        let mut token = [0u8; 16];
        token.copy_from_slice(&a[16..32]);
        let (ip, rest): (IpAddr, &[u8]) = match a[32] {
            4 => (<[u8; 4]>::try_from(&a[33..37]).unwrap().into(), &a[37..]),
            _ => (<[u8; 16]>::try_from(&a[33..49]).unwrap().into(), &a[49..]),
        };
        let port = u16::from_le_bytes([rest[0], rest[1]]);
        let plen = u16::from_le_bytes([rest[2], rest[3]]) as usize;
        let local = String::from_utf8(rest[4..4 + plen].to_vec()).unwrap();
        Self {
            qpn,
            token,
            tcp: SocketAddr::new(ip, port),
            local,
        }
    }
}

/// One raw connection to a soft NIC.
pub enum Raw {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Raw {
    pub fn tcp(t: &SoftTarget) -> Self {
        let s = TcpStream::connect(t.tcp).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw::Tcp(s)
    }

    pub fn unix(t: &SoftTarget) -> Self {
        let name = t.local.strip_prefix('@').expect("an abstract socket name");
        let addr = UnixAddr::from_abstract_name(name.as_bytes()).unwrap();
        let s = UnixStream::connect_addr(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw::Unix(s)
    }

    pub fn send(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Raw::Tcp(s) => s.write_all(b),
            Raw::Unix(s) => s.write_all(b),
        }
    }

    pub fn recv(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let mut b = vec![0u8; n];
        match self {
            Raw::Tcp(s) => s.read_exact(&mut b)?,
            Raw::Unix(s) => s.read_exact(&mut b)?,
        }
        Ok(b)
    }

    /// Reads the challenge, sends a hello for `dst` claiming `src`, keyed by `token` (and
    /// `psk`), and returns the acknowledgement's status byte.
    pub fn hello(
        &mut self,
        src: u32,
        dst: u32,
        token: &[u8; 16],
        psk: Option<&[u8]>,
    ) -> std::io::Result<u8> {
        let ch = self.recv(24)?;
        assert_eq!(&ch[0..4], b"RDCH", "a challenge comes first");
        let nonce: [u8; 16] = ch[8..24].try_into().unwrap();
        let mac = hello_mac(&nonce, src, dst, token, psk);
        self.send(&hello_frame(src, dst, psk.is_some(), &mac))?;
        let ack = self.recv(8)?;
        assert_eq!(&ack[0..4], b"RDHA");
        Ok(ack[5])
    }

    /// After an OK on the local socket: the 8-byte PD message (its descriptor is dropped).
    pub fn skip_local_handshake(&mut self) -> std::io::Result<()> {
        self.recv(8).map(|_| ())
    }

    /// Sends a MAP request for `rkey` and returns (kind, byte 6) of the response.
    pub fn map(&mut self, rkey: u32) -> std::io::Result<(u8, u8)> {
        let mut req = [0u8; 56];
        req[0..4].copy_from_slice(b"RDRQ");
        req[4] = 2;
        req[5] = 6;
        req[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        req[24..28].copy_from_slice(&rkey.to_le_bytes());
        self.send(&req)?;
        let resp = self.recv(32)?;
        assert_eq!(&resp[0..4], b"RDRS");
        Ok((resp[5], resp[6]))
    }
}

/// The hello MAC (section 5.2).
pub fn hello_mac(
    nonce: &[u8; 16],
    src: u32,
    dst: u32,
    token: &[u8; 16],
    psk: Option<&[u8]>,
) -> [u8; 32] {
    let key: Vec<u8> = match psk {
        None => token.to_vec(),
        Some(k) => {
            let mut m = Hmac::<Sha256>::new_from_slice(k).unwrap();
            m.update(token);
            m.finalize().into_bytes().to_vec()
        }
    };
    let mut m = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    m.update(b"rdmapool soft hello v2");
    m.update(nonce);
    m.update(&[psk.is_some() as u8]);
    m.update(&src.to_le_bytes());
    m.update(&dst.to_le_bytes());
    m.finalize().into_bytes().into()
}

pub fn hello_frame(src: u32, dst: u32, psk: bool, mac: &[u8; 32]) -> [u8; 48] {
    let mut h = [0u8; 48];
    h[0..4].copy_from_slice(b"RDHL");
    h[4] = 2;
    h[5] = psk as u8;
    h[8..12].copy_from_slice(&src.to_le_bytes());
    h[12..16].copy_from_slice(&dst.to_le_bytes());
    h[16..48].copy_from_slice(mac);
    h
}

/// Hello acknowledgement statuses (section 5.2).
pub mod status {
    pub const OK: u8 = 0;
    pub const AUTH_FAILED: u8 = 3;
    pub const PEER_NOT_ALLOWED: u8 = 4;
    pub const ALREADY_CONNECTED: u8 = 5;
}
