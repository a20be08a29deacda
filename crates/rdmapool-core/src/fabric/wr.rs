//! Work requests and remote memory descriptors.

use crate::{Error, Result};

/// One scatter/gather entry: a range of a local memory region, named by its lkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Start address (inside the region named by `lkey`).
    pub addr: u64,
    /// Length in bytes. Zero is accepted and moves nothing (its key is not even checked), as
    /// rxe does; beware that some hardware reads a zero length as 2 GiB (mlx5), so portable
    /// code sends a zero-byte message as an empty list.
    pub length: u32,
    /// The local key of the region.
    pub lkey: u32,
}

/// A remote address: where in a peer's registered memory, and the key that grants access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr {
    /// Virtual address in the peer's region.
    pub addr: u64,
    /// The peer region's remote key.
    pub rkey: u32,
}

/// The descriptor of a registered region that a peer needs to access it one-sidedly.
///
/// Exchange it for real (RDMA CM private data, a socket, a file); never hard-code it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteRegion {
    /// Encoded size in bytes.
    pub const ENCODED_LEN: usize = 24;
    /// The first two bytes: ASCII "RD" (0x52, 0x44).
    const MAGIC: [u8; 2] = *b"RD";
    const VERSION: u8 = 1;

    /// The address `offset` bytes into the region, checked against its length.
    pub fn at(&self, offset: u64) -> Result<RemoteAddr> {
        if offset > self.len {
            return Err(Error::OutOfRange {
                what: "remote region",
                offset,
                len: 0,
                limit: self.len,
            });
        }
        Ok(RemoteAddr {
            addr: self.addr + offset,
            rkey: self.rkey,
        })
    }

    /// Encodes the descriptor (24 bytes, docs/PROTOCOL.md): "RD", version 1, a zero byte,
    /// then address (u64), length (u64) and rkey (u32), little-endian.
    ///
    /// ```
    /// use rdmapool::fabric::RemoteRegion;
    /// let b = RemoteRegion { addr: 0x1000, len: 64, rkey: 7 }.to_bytes();
    /// assert_eq!(&b[..4], b"RD\x01\x00");
    /// assert_eq!(&b[4..12], &0x1000u64.to_le_bytes());
    /// ```
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0u8; Self::ENCODED_LEN];
        b[0..2].copy_from_slice(&Self::MAGIC);
        b[2] = Self::VERSION;
        b[4..12].copy_from_slice(&self.addr.to_le_bytes());
        b[12..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..24].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Decodes a descriptor made by [`RemoteRegion::to_bytes`].
    ///
    /// ```
    /// use rdmapool::fabric::RemoteRegion;
    /// let r = RemoteRegion { addr: 0x1000, len: 64, rkey: 7 };
    /// assert_eq!(RemoteRegion::from_bytes(&r.to_bytes()).unwrap(), r);
    /// assert!(RemoteRegion::from_bytes(&[0u8; 3]).is_err());
    /// ```
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let bad = |reason: String| Error::Malformed {
            what: "region descriptor",
            reason,
        };
        if b.len() != Self::ENCODED_LEN {
            return Err(bad(format!(
                "{} bytes, expected {}",
                b.len(),
                Self::ENCODED_LEN
            )));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if b[0..2] != Self::MAGIC {
            return Err(bad(format!(
                "bad magic {:02x} {:02x} (expected \"RD\", 52 44)",
                b[0], b[1]
            )));
        }
        if b[3] != 0 {
            return Err(bad(format!("reserved byte 3 is {:#04x}, not 0", b[3])));
        }
        if b[2] != Self::VERSION {
            return Err(bad(format!("version {} (this build speaks 1)", b[2])));
        }
        let r = RemoteRegion {
            addr: u64_at(4),
            len: u64_at(12),
            rkey: u32::from_le_bytes(b[20..24].try_into().unwrap()),
        };
        if r.addr.checked_add(r.len).is_none() {
            return Err(bad("address + length overflows".into()));
        }
        Ok(r)
    }
}

impl RemoteRegion {
    /// Hex text of [`RemoteRegion::to_bytes`], handy for pipes and command lines.
    pub fn to_hex(&self) -> String {
        crate::util::hex_encode(&self.to_bytes())
    }

    /// Parses [`RemoteRegion::to_hex`] output.
    pub fn from_hex(s: &str) -> Result<Self> {
        Self::from_bytes(&crate::util::hex_decode(s.trim())?)
    }
}

/// The operation a send-queue work request performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOp {
    /// Two-sided SEND, consumed by a RECV at the peer; `imm` is delivered with it.
    Send {
        /// Optional immediate data.
        imm: Option<u32>,
    },
    /// One-sided RDMA WRITE of the gathered local data to `remote`; with `imm` it also
    /// consumes a RECV at the peer and delivers the immediate.
    Write {
        /// Destination.
        remote: RemoteAddr,
        /// Optional immediate data (WRITE_WITH_IMM).
        imm: Option<u32>,
    },
    /// One-sided RDMA READ from `remote` into the local scatter list.
    Read {
        /// Source.
        remote: RemoteAddr,
    },
    /// 8-byte compare-and-swap at `remote` (8-byte aligned); the old value lands in the
    /// single 8-byte local SGE.
    CompareSwap {
        /// Target word.
        remote: RemoteAddr,
        /// Expected value.
        compare: u64,
        /// New value if it matched.
        swap: u64,
    },
    /// 8-byte fetch-and-add at `remote` (8-byte aligned); the old value lands in the single
    /// 8-byte local SGE.
    FetchAdd {
        /// Target word.
        remote: RemoteAddr,
        /// Amount to add (wrapping).
        add: u64,
    },
    /// Invalidates the remote key of a memory window bound through this QP's PD (verbs'
    /// `IBV_WR_LOCAL_INV`): peers using it get a remote access error from then on. Takes
    /// no SGEs.
    LocalInvalidate {
        /// The window's current remote key.
        rkey: u32,
    },
}

impl WrOp {
    /// The opcode a completion of this operation reports (also for error completions, whose
    /// `ibv_wc.opcode` verbs leaves undefined: rdmapool reports the posted operation).
    pub fn completion_opcode(&self) -> crate::fabric::WcOpcode {
        use crate::fabric::WcOpcode;
        match self {
            WrOp::Send { .. } => WcOpcode::Send,
            WrOp::Write { .. } => WcOpcode::RdmaWrite,
            WrOp::Read { .. } => WcOpcode::RdmaRead,
            WrOp::CompareSwap { .. } => WcOpcode::CompSwap,
            WrOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            WrOp::LocalInvalidate { .. } => WcOpcode::LocalInv,
        }
    }
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: WrOp,
    /// Local memory: gathered from for SEND/WRITE, scattered into for READ/atomics.
    pub sg_list: &'a [Sge],
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
}

impl SendWr<'_> {
    /// Checks what every provider refuses at post time (rxe with EINVAL): an atomic needs an
    /// 8-byte aligned remote address and exactly one 8-byte local SGE for the old value.
    pub fn validate(&self) -> Result<()> {
        if let WrOp::LocalInvalidate { .. } = self.op {
            if !self.sg_list.is_empty() {
                return Err(Error::BadWorkRequest {
                    wr_id: self.wr_id,
                    reason: "a local invalidate takes no SGEs",
                });
            }
        }
        if let WrOp::CompareSwap { remote, .. } | WrOp::FetchAdd { remote, .. } = self.op {
            if !remote.addr.is_multiple_of(8) {
                return Err(Error::Misaligned {
                    what: "atomic target",
                    addr: remote.addr,
                });
            }
            if self.sg_list.len() != 1 || self.sg_list[0].length != 8 {
                return Err(Error::BadWorkRequest {
                    wr_id: self.wr_id,
                    reason: "an atomic needs one 8-byte local SGE for the old value",
                });
            }
        }
        Ok(())
    }
}

/// A receive-queue work request: where an incoming SEND lands.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Local memory to scatter the message into.
    pub sg_list: &'a [Sge],
}
