//! The soft provider's wire format (version 2), shared by the TCP and local paths.
//!
//! Little-endian fixed headers; payloads follow WRITE/SEND requests and READ responses.
//! Decoders reject a bad magic, version, opcode, reserved bits or an oversized length:
//! the connection that sent it is closed, nothing else is affected.

use crate::fabric::WcStatus;
use crate::{Error, Result};

/// Wire format version this build speaks.
pub const VERSION: u8 = 2;
const REQ_MAGIC: u32 = u32::from_le_bytes(*b"RDRQ");
const RESP_MAGIC: u32 = u32::from_le_bytes(*b"RDRS");

/// Request header length.
pub const REQ_LEN: usize = 56;
/// Response header length.
pub const RESP_LEN: usize = 32;

pub(super) fn malformed(what: &'static str, reason: impl Into<String>) -> Error {
    Error::Malformed {
        what,
        reason: reason.into(),
    }
}

pub(super) fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().unwrap())
}

/// Request operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ReqOp {
    Send = 1,
    Write = 2,
    Read = 3,
    CompareSwap = 4,
    FetchAdd = 5,
    /// Local path only: asks for the memfd of the region with `rkey` (see `shm`).
    Map = 6,
}

/// A request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: ReqOp,
    pub seq: u64,
    pub remote_addr: u64,
    pub rkey: u32,
    /// Payload length (SEND/WRITE), bytes to read (READ) or 8 (atomics).
    pub len: u32,
    pub compare_add: u64,
    pub swap: u64,
    pub imm: Option<u32>,
}

impl Request {
    pub fn encode(&self) -> [u8; REQ_LEN] {
        let mut b = [0u8; REQ_LEN];
        b[0..4].copy_from_slice(&REQ_MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.op as u8;
        b[6] = self.imm.is_some() as u8;
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.remote_addr.to_le_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_le_bytes());
        b[28..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.compare_add.to_le_bytes());
        b[40..48].copy_from_slice(&self.swap.to_le_bytes());
        b[48..52].copy_from_slice(&self.imm.unwrap_or(0).to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; REQ_LEN], max_msg: u32) -> Result<Self> {
        const W: &str = "request frame";
        if u32_at(b, 0) != REQ_MAGIC {
            return Err(malformed(W, "bad magic"));
        }
        if b[4] != VERSION {
            return Err(malformed(
                W,
                format!("version {} (this build speaks {VERSION})", b[4]),
            ));
        }
        let op = match b[5] {
            1 => ReqOp::Send,
            2 => ReqOp::Write,
            3 => ReqOp::Read,
            4 => ReqOp::CompareSwap,
            5 => ReqOp::FetchAdd,
            6 => ReqOp::Map,
            o => return Err(malformed(W, format!("unknown opcode {o}"))),
        };
        if b[6] > 1 || b[7] != 0 || u32_at(b, 52) != 0 {
            return Err(malformed(W, "reserved bits set"));
        }
        let has_imm = b[6] == 1;
        if has_imm && !matches!(op, ReqOp::Send | ReqOp::Write) {
            return Err(malformed(W, format!("{op:?} cannot carry immediate data")));
        }
        let len = u32_at(b, 28);
        if len > max_msg {
            return Err(malformed(
                W,
                format!("length {len} exceeds the {max_msg}-byte maximum"),
            ));
        }
        if op == ReqOp::Map && len != 0 {
            return Err(malformed(W, "map request with a length"));
        }
        if matches!(op, ReqOp::CompareSwap | ReqOp::FetchAdd) && len != 8 {
            return Err(malformed(W, format!("atomic of length {len}")));
        }
        Ok(Self {
            op,
            seq: u64_at(b, 8),
            remote_addr: u64_at(b, 16),
            rkey: u32_at(b, 24),
            len,
            compare_add: u64_at(b, 32),
            swap: u64_at(b, 40),
            imm: has_imm.then(|| u32_at(b, 48)),
        })
    }

    /// Bytes of payload that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        match self.op {
            ReqOp::Send | ReqOp::Write => self.len,
            _ => 0,
        }
    }
}

/// Response kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response {
    /// The request succeeded (SEND, WRITE).
    Ack { seq: u64 },
    /// READ data of `len` bytes follows.
    ReadData { seq: u64, len: u32 },
    /// Atomic result: the value before the operation.
    Atomic { seq: u64, old: u64 },
    /// The request failed at the responder; the requester completes with `status`.
    Nak { seq: u64, status: WcStatus },
    /// Answer to a map request; when `mappable`, the region's memfd rides along.
    Map { seq: u64, mappable: bool },
}

impl Response {
    pub fn seq(&self) -> u64 {
        match *self {
            Self::Ack { seq }
            | Self::ReadData { seq, .. }
            | Self::Atomic { seq, .. }
            | Self::Nak { seq, .. }
            | Self::Map { seq, .. } => seq,
        }
    }

    pub fn encode(&self) -> [u8; RESP_LEN] {
        let mut b = [0u8; RESP_LEN];
        b[0..4].copy_from_slice(&RESP_MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[8..16].copy_from_slice(&self.seq().to_le_bytes());
        match *self {
            Self::Ack { .. } => b[5] = 1,
            Self::ReadData { len, .. } => {
                b[5] = 2;
                b[16..20].copy_from_slice(&len.to_le_bytes());
            }
            Self::Atomic { old, .. } => {
                b[5] = 3;
                b[24..32].copy_from_slice(&old.to_le_bytes());
            }
            Self::Nak { status, .. } => {
                b[5] = 4;
                b[6] = status as u8;
            }
            Self::Map { mappable, .. } => {
                b[5] = 5;
                b[6] = mappable as u8;
            }
        }
        b
    }

    pub fn decode(b: &[u8; RESP_LEN], max_msg: u32) -> Result<Self> {
        const W: &str = "response frame";
        if u32_at(b, 0) != RESP_MAGIC {
            return Err(malformed(W, "bad magic"));
        }
        if b[4] != VERSION {
            return Err(malformed(W, format!("version {}", b[4])));
        }
        let seq = u64_at(b, 8);
        let len = u32_at(b, 16);
        if len > max_msg {
            return Err(malformed(W, format!("length {len} exceeds {max_msg}")));
        }
        // Bytes a kind does not use are reserved and must be zero: byte 6 (status) outside
        // NAK and map answers, 16..20 (length) outside READ data, 24..32 (old value) outside
        // atomics; 7 and 20..24 always.
        let kind = b[5];
        let unused_set = b[7] != 0
            || u32_at(b, 20) != 0
            || (!matches!(kind, 4 | 5) && b[6] != 0)
            || (kind != 2 && len != 0)
            || (kind != 3 && u64_at(b, 24) != 0);
        if unused_set {
            return Err(malformed(W, "reserved bits set"));
        }
        match kind {
            1 => Ok(Self::Ack { seq }),
            2 => Ok(Self::ReadData { seq, len }),
            3 => Ok(Self::Atomic {
                seq,
                old: u64_at(b, 24),
            }),
            4 => match WcStatus::from_u8(b[6]) {
                Some(status) if status != WcStatus::Success => Ok(Self::Nak { seq, status }),
                _ => Err(malformed(W, format!("bad NAK status {}", b[6]))),
            },
            5 if b[6] <= 1 => Ok(Self::Map {
                seq,
                mappable: b[6] == 1,
            }),
            k => Err(malformed(W, format!("unknown kind {k}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips_and_rejects_garbage() {
        let r = Request {
            op: ReqOp::Write,
            seq: 9,
            remote_addr: 0xdead_0000,
            rkey: 77,
            len: 100,
            compare_add: 0,
            swap: 0,
            imm: Some(5),
        };
        let b = r.encode();
        assert_eq!(Request::decode(&b, 1 << 20).unwrap(), r);
        assert!(Request::decode(&b, 99).is_err(), "oversized length");
        let mut bad = b;
        bad[5] = 42;
        assert!(Request::decode(&bad, 1 << 20).is_err(), "opcode");
        let mut bad = b;
        bad[4] = 1;
        assert!(Request::decode(&bad, 1 << 20).is_err(), "version");
        let mut bad = b;
        bad[53] = 1;
        assert!(Request::decode(&bad, 1 << 20).is_err(), "reserved");
    }

    #[test]
    fn response_round_trips() {
        for r in [
            Response::Ack { seq: 1 },
            Response::ReadData { seq: 2, len: 64 },
            Response::Atomic { seq: 3, old: 99 },
            Response::Nak {
                seq: 4,
                status: WcStatus::RemAccessErr,
            },
        ] {
            assert_eq!(Response::decode(&r.encode(), 1 << 20).unwrap(), r);
        }
        let mut b = Response::Nak {
            seq: 4,
            status: WcStatus::RemAccessErr,
        }
        .encode();
        b[6] = 0;
        assert!(
            Response::decode(&b, 1 << 20).is_err(),
            "NAK with success status"
        );
        // Every byte a kind does not use is checked.
        for (r, unused) in [
            (Response::Ack { seq: 1 }, [6, 7, 16, 20, 24, 31].as_slice()),
            (Response::ReadData { seq: 2, len: 64 }, &[6, 7, 20, 24]),
            (Response::Atomic { seq: 3, old: 99 }, &[6, 7, 16, 23]),
        ] {
            for &i in unused {
                let mut b = r.encode();
                b[i] = 1;
                assert!(Response::decode(&b, 1 << 20).is_err(), "{r:?} byte {i}");
            }
        }
    }
}
