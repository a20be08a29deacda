//! What a memory server tells a client in the accept's private data, and what a client says
//! in its connection request. Byte layouts: docs/PROTOCOL.md ("Remote pool").

use super::layout::{Layout, LAYOUT_VERSION};
use crate::fabric::{PreSharedKey, RemoteRegion};
use crate::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;
use std::time::Duration;

/// Bytes of an encoded [`PoolDescriptor`].
pub const DESCRIPTOR_LEN: usize = 72;
/// Bytes of a server's proof that it holds the cluster key (an HMAC-SHA256 under the
/// client's key, which only the cluster key derives), after the descriptor in the accept
/// when the server has a key.
pub const PROOF_LEN: usize = 32;
/// Accept flag (byte 3): a proof follows the descriptor.
const FLAG_PROOF: u8 = 1;
/// Descriptor flag (byte 3): the server isolates its clients.
const FLAG_ISOLATED: u8 = 2;
/// What the proof's MAC covers first (then the descriptor, then the client's hello). v3: the
/// key is the client's key ([`super::hello::client_key`]), not the cluster key itself.
const PROOF_LABEL: &[u8] = b"rdmapool pool server proof v3";

fn malformed(what: &'static str, reason: impl Into<String>) -> Error {
    Error::Core(crate::CoreError::Malformed {
        what,
        reason: reason.into(),
    })
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

/// Everything a client needs to use a memory server, learned from the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolDescriptor {
    /// The server's node id (unique in the cluster).
    pub node: u32,
    /// The registered region (address, length, remote key).
    pub region: RemoteRegion,
    /// How the region is laid out.
    pub layout: Layout,
    /// How long a client's lease lasts without renewal.
    pub lease: Duration,
    /// Which start of the server this is: random and non-zero, new at every start (a server
    /// restarted with the same node id and address has a new one). Every [`super::RemotePtr`]
    /// carries the incarnation it was allocated in, and the client refuses a pointer of
    /// another one ([`crate::Error::StalePointer`]) before any byte moves.
    pub incarnation: u64,
    /// Whether the server isolates its clients (docs/PROTOCOL.md section 7.6): each reaches
    /// only its own lease slot and chunks, through windows bound to its connection, and
    /// claims and releases chunks through the server. `region.rkey` then grants nothing.
    pub isolated: bool,
}

impl PoolDescriptor {
    /// The 72 bytes that travel in the accept's private data.
    pub fn encode(&self) -> [u8; DESCRIPTOR_LEN] {
        let mut b = [0u8; DESCRIPTOR_LEN];
        b[0..2].copy_from_slice(b"RP");
        b[2] = LAYOUT_VERSION;
        b[3] = if self.isolated { FLAG_ISOLATED } else { 0 };
        b[4..8].copy_from_slice(&self.node.to_le_bytes());
        b[8..16].copy_from_slice(&self.region.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.region.len.to_le_bytes());
        b[24..28].copy_from_slice(&self.region.rkey.to_le_bytes());
        let lease_ms = self.lease.as_millis().min(u32::MAX as u128) as u32;
        b[28..32].copy_from_slice(&lease_ms.to_le_bytes());
        b[32..40].copy_from_slice(&self.layout.chunk_size.to_le_bytes());
        b[40..48].copy_from_slice(&self.layout.table_offset.to_le_bytes());
        b[48..52].copy_from_slice(&(self.layout.chunk_count as u32).to_le_bytes());
        b[52..56].copy_from_slice(&(self.layout.client_count as u32).to_le_bytes());
        b[56..64].copy_from_slice(&self.layout.data_offset.to_le_bytes());
        b[64..72].copy_from_slice(&self.incarnation.to_le_bytes());
        b
    }

    /// Decodes and checks a descriptor: magic, version, reserved byte, a layout that fits
    /// the region within the local limits, a lease from 10 ms to an hour, and a non-zero
    /// incarnation.
    pub fn decode(b: &[u8]) -> Result<Self> {
        const W: &str = "pool descriptor";
        if b.len() != DESCRIPTOR_LEN {
            return Err(malformed(
                W,
                format!("{} bytes, want {DESCRIPTOR_LEN}", b.len()),
            ));
        }
        if &b[0..2] != b"RP" {
            return Err(malformed(W, "bad magic"));
        }
        if b[2] != LAYOUT_VERSION {
            return Err(malformed(
                W,
                format!("version {} (this build speaks {LAYOUT_VERSION})", b[2]),
            ));
        }
        if b[3] & !FLAG_ISOLATED != 0 {
            return Err(malformed(W, format!("unknown flags {:#04x}", b[3])));
        }
        let region = RemoteRegion {
            addr: u64_at(b, 8),
            len: u64_at(b, 16),
            rkey: u32_at(b, 24),
        };
        let layout = Layout {
            len: region.len,
            chunk_size: u64_at(b, 32),
            table_offset: u64_at(b, 40),
            chunk_count: u32_at(b, 48) as u64,
            client_count: u32_at(b, 52) as u64,
            data_offset: u64_at(b, 56),
        };
        layout
            .check()
            .map_err(|e| malformed(W, format!("impossible layout: {e}")))?;
        if region.addr.checked_add(region.len).is_none() {
            return Err(malformed(W, "region wraps the address space"));
        }
        let lease_ms = u32_at(b, 28);
        if lease_ms < 10 || u128::from(lease_ms) > super::layout::MAX_LEASE.as_millis() {
            return Err(malformed(W, format!("lease of {lease_ms} ms")));
        }
        let incarnation = u64_at(b, 64);
        if incarnation == 0 {
            return Err(malformed(W, "incarnation 0"));
        }
        Ok(Self {
            node: u32_at(b, 4),
            region,
            layout,
            lease: Duration::from_millis(lease_ms as u64),
            incarnation,
            isolated: b[3] & FLAG_ISOLATED != 0,
        })
    }
}

/// The accept's private data of a server with a cluster key, for a client whose key
/// ([`super::hello::client_key`]) is `key`: the descriptor, flagged, and the proof (an
/// HMAC-SHA256 under the key over a label, the descriptor and the client's hello, whose nonce
/// makes it fresh). Without a key, the descriptor alone.
pub(crate) fn encode_accept(
    desc: &PoolDescriptor,
    hello: &[u8],
    key: Option<&PreSharedKey>,
) -> Vec<u8> {
    let mut b = desc.encode().to_vec();
    if let Some(key) = key {
        b[3] |= FLAG_PROOF;
        let proof = proof(key, &b, hello);
        b.extend_from_slice(&proof);
    }
    b
}

fn mac(key: &PreSharedKey, desc: &[u8], hello: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key.bytes()).expect("HMAC takes keys of any length");
    m.update(PROOF_LABEL);
    m.update(desc);
    m.update(hello);
    m
}

fn proof(key: &PreSharedKey, desc: &[u8], hello: &[u8]) -> [u8; PROOF_LEN] {
    mac(key, desc, hello).finalize().into_bytes().into()
}

/// Decodes a server's accept (`b`) to the `hello` this client sent. With a client key
/// (`key`, of the cluster key) the server must prove it holds the cluster key
/// ([`Error::Unauthenticated`] otherwise, naming `peer`); without one, a proof is not checked.
pub(crate) fn decode_accept(
    b: &[u8],
    hello: &[u8],
    key: Option<&PreSharedKey>,
    peer: &str,
) -> Result<PoolDescriptor> {
    let body = b.get(..DESCRIPTOR_LEN).unwrap_or(b);
    // Byte 3 carries the flags in an accept; the descriptor itself has it zero.
    let flags = body.get(3).copied().unwrap_or(0);
    if flags & !(FLAG_PROOF | FLAG_ISOLATED) != 0 {
        return Err(malformed(
            "pool accept",
            format!("unknown flags {flags:#04x}"),
        ));
    }
    let mut plain = body.to_vec();
    if let Some(f) = plain.get_mut(3) {
        *f &= !FLAG_PROOF;
    }
    let desc = PoolDescriptor::decode(&plain)?;
    let proven = flags & FLAG_PROOF != 0;
    let want = DESCRIPTOR_LEN + if proven { PROOF_LEN } else { 0 };
    if b.len() != want {
        return Err(malformed(
            "pool accept",
            format!("{} bytes, want {want}", b.len()),
        ));
    }
    let Some(key) = key else {
        return Ok(desc);
    };
    let refuse = |reason: &str| Error::Unauthenticated {
        peer: format!("pool node {} at {peer}", desc.node),
        reason: reason.into(),
    };
    if !proven {
        return Err(refuse(
            "it sent no proof of the cluster key (a server without the key, or not a server \
             of this cluster)",
        ));
    }
    mac(key, body, hello)
        .verify_slice(&b[DESCRIPTOR_LEN..])
        .map_err(|_| refuse("its proof does not verify (it holds another key)"))?;
    Ok(desc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PoolDescriptor {
        PoolDescriptor {
            node: 7,
            region: RemoteRegion {
                addr: 0x7f00_0000_0000,
                len: 1 << 30,
                rkey: 0x1234,
            },
            layout: Layout::new(1 << 30, 2 << 20, 256).unwrap(),
            lease: Duration::from_secs(2),
            incarnation: 0x0123_4567_89ab_cdef,
            isolated: false,
        }
    }

    #[test]
    fn descriptors_round_trip_and_bad_ones_are_typed_errors() {
        let d = sample();
        assert_eq!(PoolDescriptor::decode(&d.encode()).unwrap(), d);
        let bad = |f: &dyn Fn(&mut [u8; DESCRIPTOR_LEN])| {
            let mut b = d.encode();
            f(&mut b);
            match PoolDescriptor::decode(&b) {
                Err(Error::Core(crate::CoreError::Malformed { .. })) => {}
                other => panic!("expected Malformed, got {other:?}"),
            }
        };
        bad(&|b| b[2] = 9); // version
        bad(&|b| b[0] = b'X'); // magic
        bad(&|b| b[3] = 1); // the accept's proof flag is not the descriptor's
        bad(&|b| b[3] = 4); // unknown
        let iso = PoolDescriptor {
            isolated: true,
            ..d
        };
        assert_eq!(PoolDescriptor::decode(&iso.encode()).unwrap(), iso);
        bad(&|b| b[48..52].copy_from_slice(&u32::MAX.to_le_bytes())); // chunks past the end
        bad(&|b| b[32..40].copy_from_slice(&(3u64 << 20).to_le_bytes())); // chunk size
        bad(&|b| b[28..32].copy_from_slice(&0u32.to_le_bytes())); // lease
        bad(&|b| b[28..32].copy_from_slice(&u32::MAX.to_le_bytes())); // a 49-day lease
        bad(&|b| b[64..72].copy_from_slice(&0u64.to_le_bytes())); // incarnation
        assert!(PoolDescriptor::decode(&d.encode()[..DESCRIPTOR_LEN - 1]).is_err());
        // A geometry that fits its (claimed) region, but with 2^32 - 1 client slots and a
        // 256 GiB chunk: a client would read 128 GiB of owner words and probe slot after
        // slot (issue #22, finding 1). Refused by the local limits.
        bad(&|b| {
            let chunk = 1u64 << 38;
            b[16..24].copy_from_slice(&(2 * chunk).to_le_bytes()); // region len
            b[32..40].copy_from_slice(&chunk.to_le_bytes());
            b[40..48].copy_from_slice(&((1u64 << 37) + 8192).to_le_bytes()); // table
            b[48..52].copy_from_slice(&1u32.to_le_bytes());
            b[52..56].copy_from_slice(&u32::MAX.to_le_bytes());
            b[56..64].copy_from_slice(&chunk.to_le_bytes());
        });
    }

    #[test]
    fn a_server_proves_the_cluster_key_for_this_connection_only() {
        let d = sample();
        let key = PreSharedKey::new(&[7; 32]).unwrap();
        let other = PreSharedKey::new(&[8; 32]).unwrap();
        let hello = super::super::ClientHello::new(42).unwrap().encode();
        let accept = encode_accept(&d, &hello, Some(&key));
        assert_eq!(accept.len(), DESCRIPTOR_LEN + PROOF_LEN);
        assert_eq!(decode_accept(&accept, &hello, Some(&key), "x").unwrap(), d);
        // Without a key the client does not check; with another key, or none on the
        // server, or the proof of another connection's hello, it refuses.
        assert_eq!(decode_accept(&accept, &hello, None, "x").unwrap(), d);
        let refused = |b: &[u8], h: &[u8]| {
            matches!(
                decode_accept(b, h, Some(&key), "x"),
                Err(Error::Unauthenticated { .. })
            )
        };
        assert!(refused(&encode_accept(&d, &hello, Some(&other)), &hello));
        assert!(refused(&encode_accept(&d, &hello, None), &hello));
        let replayed = super::super::ClientHello::new(42).unwrap().encode();
        assert!(
            refused(&accept, &replayed),
            "a proof recorded for another hello"
        );
        // The descriptor under the proof cannot be changed.
        let mut forged = accept.clone();
        forged[4] ^= 1;
        assert!(refused(&forged, &hello));
        // A flag that says a proof follows, and none does: malformed.
        assert!(decode_accept(&accept[..DESCRIPTOR_LEN], &hello, None, "x").is_err());
    }
}
