//! The control messages of an isolated pool (docs/PROTOCOL.md section 7.6): 32 bytes each,
//! two-sided (SEND/RECV) on the client's own connection.

use crate::{Error, Result};

/// Bytes of every control message.
pub(crate) const CONTROL_LEN: usize = 32;
const MAGIC: &[u8; 2] = b"RI";
const VERSION: u8 = 1;
/// An [`Control::Answer`]'s `old` when the server refused the request outright (the chunk
/// index is out of range, or the connection holds no lease slot).
pub(crate) const REFUSED: u64 = u64::MAX;
/// A claim's [`Control::Answer`] `old` when the client id already owns as many chunks, or
/// bytes, as the server allows one id (`ServerConfig::max_chunks_per_client`,
/// `ServerConfig::max_bytes_per_client`).
pub(crate) const QUOTA_REACHED: u64 = u64::MAX - 1;
/// A [`Control::Granted`]'s slot when every lease slot is held by another client.
pub(crate) const NO_SLOT: u64 = u64::MAX;

/// One control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// Client → server, once after connecting: give me my lease slot and the windows.
    Setup { req: u32 },
    /// Server → client: the slot index (or [`NO_SLOT`]), the key of the read-only window
    /// over the header, slots and chunk table, the key of the window over the slot, and
    /// the heartbeat the server gave a slot it claimed for this id now (`beat`, non-zero),
    /// or 0 when the id held the slot already (a restart: the client takes it over).
    Granted {
        req: u32,
        slot: u64,
        meta_rkey: u32,
        slot_rkey: u32,
        beat: u64,
    },
    /// Client → server: compare-and-swap table entry `chunk` from 0 to this client's id,
    /// and on success bind a window over the chunk.
    Claim { req: u32, chunk: u64 },
    /// Client → server: compare-and-swap table entry `chunk` from this client's id (or
    /// from `2^63 | id`, a store chunk of its) to 0, revoking the chunk's windows first.
    Release { req: u32, chunk: u64 },
    /// Client → server: a window over `chunk`, which this client owns (after a restart, or
    /// on another connection than the one that claimed it).
    Access { req: u32, chunk: u64 },
    /// Server → client: the table entry's old value ([`REFUSED`]: refused outright), and
    /// the window's key when one was bound (0 otherwise).
    Answer { req: u32, old: u64, rkey: u32 },
    /// Client → server: compare-and-swap table entry `chunk` from 0 to `2^63 | id` (a
    /// chunk of this tenant's store namespace, which outlives its lease), and on success
    /// bind a window over the chunk.
    ClaimStore { req: u32, chunk: u64 },
}

impl Control {
    /// The request id (answers carry their request's).
    pub(crate) fn req(&self) -> u32 {
        match *self {
            Control::Setup { req }
            | Control::Granted { req, .. }
            | Control::Claim { req, .. }
            | Control::Release { req, .. }
            | Control::Access { req, .. }
            | Control::Answer { req, .. }
            | Control::ClaimStore { req, .. } => req,
        }
    }

    /// The 32 bytes on the wire.
    pub(crate) fn encode(&self) -> [u8; CONTROL_LEN] {
        let mut b = [0u8; CONTROL_LEN];
        b[0..2].copy_from_slice(MAGIC);
        b[2] = VERSION;
        b[4..8].copy_from_slice(&self.req().to_le_bytes());
        let (kind, a, c, e) = match *self {
            Control::Setup { .. } => (1, 0, 0, 0),
            Control::Granted {
                slot,
                meta_rkey,
                slot_rkey,
                beat,
                ..
            } => (
                2,
                slot,
                u64::from(meta_rkey) | u64::from(slot_rkey) << 32,
                beat,
            ),
            Control::Claim { chunk, .. } => (3, chunk, 0, 0),
            Control::Release { chunk, .. } => (4, chunk, 0, 0),
            Control::Access { chunk, .. } => (5, chunk, 0, 0),
            Control::Answer { old, rkey, .. } => (6, 0, old, u64::from(rkey)),
            Control::ClaimStore { chunk, .. } => (7, chunk, 0, 0),
        };
        b[3] = kind;
        b[8..16].copy_from_slice(&a.to_le_bytes());
        b[16..24].copy_from_slice(&c.to_le_bytes());
        b[24..32].copy_from_slice(&e.to_le_bytes());
        b
    }

    /// Decodes and checks a message (reserved bytes zero, fields of other kinds zero).
    pub(crate) fn decode(b: &[u8]) -> Result<Self> {
        let bad = |why: &str| {
            Error::Core(crate::CoreError::Malformed {
                what: "pool control message",
                reason: why.into(),
            })
        };
        if b.len() != CONTROL_LEN || &b[0..2] != MAGIC || b[2] != VERSION {
            return Err(bad("bad length, magic or version"));
        }
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let req = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let (a, c, e) = (u64_at(8), u64_at(16), u64_at(24));
        let m = match b[3] {
            1 => Control::Setup { req },
            2 => Control::Granted {
                req,
                slot: a,
                meta_rkey: c as u32,
                slot_rkey: (c >> 32) as u32,
                beat: e,
            },
            3 => Control::Claim { req, chunk: a },
            4 => Control::Release { req, chunk: a },
            5 => Control::Access { req, chunk: a },
            6 => Control::Answer {
                req,
                old: c,
                rkey: e as u32,
            },
            7 => Control::ClaimStore { req, chunk: a },
            k => return Err(bad(&format!("unknown kind {k}"))),
        };
        // Fields the kind does not use are zero: one encoding per message.
        if m.encode() != b {
            return Err(bad("a field the kind does not use is set"));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_ones_are_typed_errors() {
        for m in [
            Control::Setup { req: 1 },
            Control::Granted {
                req: 2,
                slot: 5,
                meta_rkey: 0xdead_beef,
                slot_rkey: 0x1234_5678,
                beat: 77,
            },
            Control::Claim { req: 3, chunk: 9 },
            Control::Release { req: 4, chunk: 9 },
            Control::Access { req: 5, chunk: 9 },
            Control::ClaimStore { req: 7, chunk: 9 },
            Control::Answer {
                req: 6,
                old: REFUSED,
                rkey: 7,
            },
        ] {
            assert_eq!(Control::decode(&m.encode()).unwrap(), m);
        }
        let mut b = Control::Claim { req: 3, chunk: 9 }.encode();
        b[20] = 1; // a field a claim does not use
        assert!(Control::decode(&b).is_err());
        let mut b = Control::Answer {
            req: 3,
            old: 0,
            rkey: 1,
        }
        .encode();
        b[30] = 1; // an rkey past 32 bits
        assert!(Control::decode(&b).is_err());
        let mut b = Control::Setup { req: 1 }.encode();
        b[3] = 9;
        assert!(Control::decode(&b).is_err());
        assert!(Control::decode(&b[..31]).is_err());
    }
}
