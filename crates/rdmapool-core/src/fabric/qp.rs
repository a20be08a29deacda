//! Queue-pair states, configuration and endpoint descriptors.

use super::ProviderKind;
use crate::{Error, Result};
use std::fmt;
use std::time::Duration;

/// RC queue-pair state, as in `enum ibv_qp_state` (SQD/SQE are not modelled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    /// Just created; nothing can be posted.
    Reset = 0,
    /// Receives may be posted.
    Init = 1,
    /// Ready to receive: bound to its peer.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// A fatal error happened; every work request completes with a flush error.
    Error = 4,
}

impl QpState {
    #[doc(hidden)]
    pub fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Reset,
            1 => Self::Init,
            2 => Self::Rtr,
            3 => Self::Rts,
            _ => Self::Error,
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Reset => "RESET",
            Self::Init => "INIT",
            Self::Rtr => "RTR",
            Self::Rts => "RTS",
            Self::Error => "ERR",
        })
    }
}

/// How many work requests a QP's queues hold: exactly what [`QpConfig`] asked for, on every
/// provider (rxe rounds a ring of 4 up to 7; verbs holds it to 4). Posting beyond it fails
/// with [`crate::Error::QueueFull`] naming this number.
///
/// An entry is in use from its post until the completion that retires it is polled (for an
/// unsignaled send, the next signaled completion of the QP), on every provider; see
/// [`super::Qp::post_send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCapacity {
    /// Send-queue entries.
    pub send: u32,
    /// Receive-queue entries.
    pub recv: u32,
}

/// How to create a queue pair.
#[derive(Debug, Clone)]
pub struct QpConfig {
    /// Send-queue depth (outstanding send work requests).
    pub max_send_wr: u32,
    /// Receive-queue depth.
    pub max_recv_wr: u32,
    /// Most SGEs in one work request.
    pub max_sge: u32,
    /// How long an outstanding work request may wait for its peer before it completes with
    /// [`crate::fabric::WcStatus::RetryExcErr`] (the product of verbs' timeout and retry count).
    pub timeout: Duration,
    /// How long an incoming SEND waits for a posted RECV before the sender gets
    /// [`crate::fabric::WcStatus::RnrRetryExcErr`].
    pub rnr_timeout: Duration,
    /// RDMA READs and atomics this QP keeps outstanding as initiator, and accepts as
    /// responder (verbs' `max_rd_atomic`/`max_dest_rd_atomic`); 0 means the device maximum.
    /// RDMA CM negotiates it down to what the peer offers. (The soft provider has no such
    /// limit and ignores it.)
    pub max_rd_atomic: u8,
}

impl QpConfig {
    /// Checks the configuration against the device's limits (once, for every provider).
    #[doc(hidden)]
    pub fn check(&self, dev: &super::DeviceInfo) -> crate::Result<()> {
        let max = dev.max_qp_wr;
        let limit = |what, value: u32, min, max: u32| crate::Error::OutOfLimits {
            what,
            value: value.into(),
            min,
            max: max.into(),
        };
        if self.max_send_wr == 0 || self.max_send_wr > max {
            return Err(limit("send queue depth", self.max_send_wr, 1, max));
        }
        if self.max_recv_wr > max {
            return Err(limit("receive queue depth", self.max_recv_wr, 0, max));
        }
        if self.max_sge == 0 || self.max_sge > dev.max_sge {
            return Err(limit("max_sge", self.max_sge, 1, dev.max_sge));
        }
        Ok(())
    }
}

impl Default for QpConfig {
    fn default() -> Self {
        Self {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_sge: 4,
            timeout: Duration::from_secs(4),
            rnr_timeout: Duration::from_secs(1),
            max_rd_atomic: 0,
        }
    }
}

/// What a peer needs to connect to a queue pair: exchange it out of band, both ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The provider of the QP.
    pub provider: ProviderKind,
    /// The QP number.
    pub qpn: u32,
    /// Provider-specific addressing (soft: host id, TCP address, local socket path).
    #[doc(hidden)]
    pub address: Vec<u8>,
}

impl Endpoint {
    const MAGIC: [u8; 2] = *b"EP";
    const VERSION: u8 = 1;
    /// Largest encoded endpoint accepted.
    pub const MAX_LEN: usize = 512;

    /// Encodes the endpoint for exchange.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(10 + self.address.len());
        b.extend_from_slice(&Self::MAGIC);
        b.push(Self::VERSION);
        b.push(match self.provider {
            ProviderKind::Soft => 0,
            ProviderKind::Verbs => 1,
        });
        b.extend_from_slice(&self.qpn.to_le_bytes());
        b.extend_from_slice(&(self.address.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.address);
        b
    }

    /// Decodes an endpoint made by [`Endpoint::to_bytes`], rejecting anything malformed.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let bad = |reason: String| Error::Malformed {
            what: "endpoint",
            reason,
        };
        if b.len() < 10 || b.len() > Self::MAX_LEN {
            return Err(bad(format!(
                "{} bytes (10..={} allowed)",
                b.len(),
                Self::MAX_LEN
            )));
        }
        if b[0..2] != Self::MAGIC {
            return Err(bad("bad magic".into()));
        }
        if b[2] != Self::VERSION {
            return Err(bad(format!("version {} (this build speaks 1)", b[2])));
        }
        let provider = match b[3] {
            0 => ProviderKind::Soft,
            1 => ProviderKind::Verbs,
            p => return Err(bad(format!("unknown provider {p}"))),
        };
        let qpn = u32::from_le_bytes(b[4..8].try_into().unwrap());
        let len = u16::from_le_bytes([b[8], b[9]]) as usize;
        if b.len() != 10 + len {
            return Err(bad(format!(
                "address length {len} does not match {} bytes",
                b.len()
            )));
        }
        Ok(Self {
            provider,
            qpn,
            address: b[10..].to_vec(),
        })
    }

    /// Hex text of [`Endpoint::to_bytes`], handy for pipes and command lines.
    pub fn to_hex(&self) -> String {
        crate::util::hex_encode(&self.to_bytes())
    }

    /// Parses [`Endpoint::to_hex`] output.
    pub fn from_hex(s: &str) -> Result<Self> {
        Self::from_bytes(&crate::util::hex_decode(s.trim())?)
    }
}
