//! How a verbs QP is reached (the address inside its [`crate::fabric::Endpoint`]) and the IB timer encodings
//! used when connecting it.

use crate::{Error, Result};

/// The verbs address in an [`crate::fabric::Endpoint`]: LID, GID, initial PSN, path MTU, link layer.
pub(super) struct VerbsAddress {
    pub(super) lid: u16,
    pub(super) gid: [u8; 16],
    pub(super) psn: u32,
    pub(super) mtu: u8,
    pub(super) link_layer: u8,
}

impl VerbsAddress {
    pub(super) const LEN: usize = 24;

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::LEN);
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.extend_from_slice(&self.gid);
        b.extend_from_slice(&self.psn.to_le_bytes());
        b.push(self.mtu);
        b.push(self.link_layer);
        b
    }

    pub(super) fn decode(b: &[u8]) -> Result<Self> {
        if b.len() != Self::LEN {
            return Err(Error::Malformed {
                what: "verbs endpoint address",
                reason: format!("{} bytes, expected {}", b.len(), Self::LEN),
            });
        }
        Ok(Self {
            lid: u16::from_le_bytes([b[0], b[1]]),
            gid: b[2..18].try_into().unwrap(),
            psn: u32::from_le_bytes(b[18..22].try_into().unwrap()) & 0xff_ffff,
            mtu: b[22],
            link_layer: b[23],
        })
    }
}

/// The IB local ACK timeout exponent whose (retry_cnt + 1) tries add up to about `total`.
pub(super) fn ack_timeout_exponent(total: std::time::Duration, retry_cnt: u32) -> u8 {
    let per_try_ns = total.as_nanos() as f64 / (retry_cnt + 1) as f64;
    let exp = (per_try_ns / 4096.0).log2().ceil();
    exp.clamp(1.0, 31.0) as u8
}

/// The smallest RNR timer code (IB spec table) of at least `ms` milliseconds.
pub(super) fn rnr_timer_code(ms: f64) -> u8 {
    const TABLE: [(u8, f64); 31] = [
        (1, 0.01),
        (2, 0.02),
        (3, 0.03),
        (4, 0.04),
        (5, 0.06),
        (6, 0.08),
        (7, 0.12),
        (8, 0.16),
        (9, 0.24),
        (10, 0.32),
        (11, 0.48),
        (12, 0.64),
        (13, 0.96),
        (14, 1.28),
        (15, 1.92),
        (16, 2.56),
        (17, 3.84),
        (18, 5.12),
        (19, 7.68),
        (20, 10.24),
        (21, 15.36),
        (22, 20.48),
        (23, 30.72),
        (24, 40.96),
        (25, 61.44),
        (26, 81.92),
        (27, 122.88),
        (28, 163.84),
        (29, 245.76),
        (30, 327.68),
        (31, 491.52),
    ];
    TABLE.iter().find(|(_, v)| *v >= ms).map_or(31, |(c, _)| *c)
}
