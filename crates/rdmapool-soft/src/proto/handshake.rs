//! The handshake that opens a soft data connection, without I/O.
//!
//! 1. The responder speaks first: a [`Challenge`] with a fresh 16-byte nonce.
//! 2. The requester answers with a [`Hello`]: its QP, the QP it wants, and a MAC over the
//!    nonce and both QP numbers, keyed by the target QP's secret token (which only the peer
//!    that received the target's endpoint knows) and, when configured, the pre-shared key.
//! 3. The responder checks the MAC (in constant time), the peer's credentials and its limits,
//!    and answers with a [`HelloStatus`].
//!
//! Nothing secret crosses the wire: the MAC is bound to a nonce the responder chose, so a
//! recorded hello cannot be replayed. docs/PROTOCOL.md has the bytes.

use super::wire::{malformed, u32_at, VERSION};
use crate::Result;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const CHALLENGE_MAGIC: u32 = u32::from_le_bytes(*b"RDCH");
const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"RDHL");
const HELLO_ACK_MAGIC: u32 = u32::from_le_bytes(*b"RDHA");

/// Challenge length.
pub const CHALLENGE_LEN: usize = 24;
/// Hello length.
pub const HELLO_LEN: usize = 48;
/// Hello acknowledgement length.
pub const HELLO_ACK_LEN: usize = 8;
/// Length of a QP's secret token.
pub const TOKEN_LEN: usize = 16;
/// Hello flag: the MAC key includes the pre-shared key.
pub const FLAG_PSK: u8 = 1;

/// Domain separation for the hello MAC.
const MAC_LABEL: &[u8] = b"rdmapool soft hello v2";

type HmacSha256 = Hmac<Sha256>;

/// The responder's first frame: a nonce the hello must be bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    pub nonce: [u8; 16],
}

impl Challenge {
    /// A challenge with a nonce from the OS CSPRNG.
    pub fn fresh() -> Result<Self> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|e| crate::Error::Sys {
            call: "getrandom",
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(Self { nonce })
    }

    pub fn encode(&self) -> [u8; CHALLENGE_LEN] {
        let mut b = [0u8; CHALLENGE_LEN];
        b[0..4].copy_from_slice(&CHALLENGE_MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[8..24].copy_from_slice(&self.nonce);
        b
    }

    pub fn decode(b: &[u8; CHALLENGE_LEN]) -> Result<Self> {
        const W: &str = "hello challenge";
        if u32_at(b, 0) != CHALLENGE_MAGIC {
            return Err(malformed(W, "bad magic"));
        }
        if b[4] != VERSION {
            return Err(malformed(
                W,
                format!("version {} (this build speaks {VERSION})", b[4]),
            ));
        }
        if b[5..8] != [0, 0, 0] {
            return Err(malformed(W, "reserved bits set"));
        }
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&b[8..24]);
        Ok(Self { nonce })
    }
}

/// The requester's answer: which QP it is, which QP it wants, and the proof that it was
/// given the target's endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub flags: u8,
    pub src_qpn: u32,
    pub dst_qpn: u32,
    pub mac: [u8; 32],
}

/// The MAC key for a target QP's `token`: the token itself, or HMAC-SHA256(psk, token) when a
/// pre-shared key is configured (then a token seen on the wire is worth nothing alone).
pub fn mac_key(token: &[u8; TOKEN_LEN], psk: Option<&[u8]>) -> Vec<u8> {
    match psk {
        None => token.to_vec(),
        Some(psk) => {
            let mut m = HmacSha256::new_from_slice(psk).expect("HMAC takes keys of any length");
            m.update(token);
            m.finalize().into_bytes().to_vec()
        }
    }
}

fn hello_mac(key: &[u8], nonce: &[u8; 16], flags: u8, src_qpn: u32, dst_qpn: u32) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(MAC_LABEL);
    m.update(nonce);
    m.update(&[flags]);
    m.update(&src_qpn.to_le_bytes());
    m.update(&dst_qpn.to_le_bytes());
    m
}

impl Hello {
    /// The hello for `challenge`, proving knowledge of the target's token (and the PSK).
    pub fn answer(
        challenge: &Challenge,
        src_qpn: u32,
        dst_qpn: u32,
        token: &[u8; TOKEN_LEN],
        psk: Option<&[u8]>,
    ) -> Self {
        let flags = if psk.is_some() { FLAG_PSK } else { 0 };
        let key = mac_key(token, psk);
        let mac = hello_mac(&key, &challenge.nonce, flags, src_qpn, dst_qpn)
            .finalize()
            .into_bytes()
            .into();
        Self {
            flags,
            src_qpn,
            dst_qpn,
            mac,
        }
    }

    /// Whether the MAC proves knowledge of `token` (and `psk`) for `challenge`; the
    /// comparison takes the same time whatever the bytes.
    pub fn verify(
        &self,
        challenge: &Challenge,
        token: &[u8; TOKEN_LEN],
        psk: Option<&[u8]>,
    ) -> bool {
        if (self.flags & FLAG_PSK != 0) != psk.is_some() {
            return false;
        }
        let key = mac_key(token, psk);
        hello_mac(
            &key,
            &challenge.nonce,
            self.flags,
            self.src_qpn,
            self.dst_qpn,
        )
        .verify_slice(&self.mac)
        .is_ok()
    }

    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.flags;
        b[8..12].copy_from_slice(&self.src_qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.dst_qpn.to_le_bytes());
        b[16..48].copy_from_slice(&self.mac);
        b
    }

    pub fn decode(b: &[u8; HELLO_LEN]) -> Result<Self> {
        const W: &str = "hello frame";
        if u32_at(b, 0) != HELLO_MAGIC {
            return Err(malformed(W, "bad magic"));
        }
        if b[4] != VERSION {
            return Err(malformed(
                W,
                format!("version {} (this build speaks {VERSION})", b[4]),
            ));
        }
        if b[5] & !FLAG_PSK != 0 || b[6..8] != [0, 0] {
            return Err(malformed(W, "reserved bits set"));
        }
        let mut mac = [0u8; 32];
        mac.copy_from_slice(&b[16..48]);
        Ok(Self {
            flags: b[5],
            src_qpn: u32_at(b, 8),
            dst_qpn: u32_at(b, 12),
            mac,
        })
    }
}

/// The responder's answer to a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum HelloStatus {
    Ok = 0,
    /// No such QP: no longer sent (an unknown QP is answered `AuthFailed`, as a wrong MAC);
    /// still understood from older responders.
    NoSuchQp = 1,
    QpInError = 2,
    /// The MAC did not prove knowledge of the QP's token (or of the pre-shared key).
    AuthFailed = 3,
    /// The peer's credentials (its user) are not allowed on this NIC.
    PeerNotAllowed = 4,
    /// The QP already has its connection (an RC QP has one peer).
    AlreadyConnected = 5,
}

impl HelloStatus {
    /// What a requester should be told.
    pub fn describe(self, dst_qpn: u32) -> String {
        match self {
            Self::Ok => "accepted".into(),
            Self::NoSuchQp => format!("peer has no QP {dst_qpn}"),
            Self::QpInError => format!("peer QP {dst_qpn} is in the error state"),
            Self::AuthFailed => format!(
                "peer QP {dst_qpn} refused the authentication: the endpoint is stale or not \
                 this QP's (or the QP is gone), or the pre-shared keys differ \
                 (RDMAPOOL_SOFT_PSK_FILE on both sides)"
            ),
            Self::PeerNotAllowed => "the peer does not allow this user to connect (its \
                 RDMAPOOL_SOFT_ALLOW_UIDS)"
                .into(),
            Self::AlreadyConnected => format!("peer QP {dst_qpn} is already connected"),
        }
    }
}

pub fn encode_hello_ack(s: HelloStatus) -> [u8; HELLO_ACK_LEN] {
    let mut b = [0u8; HELLO_ACK_LEN];
    b[0..4].copy_from_slice(&HELLO_ACK_MAGIC.to_le_bytes());
    b[4] = VERSION;
    b[5] = s as u8;
    b
}

pub fn decode_hello_ack(b: &[u8; HELLO_ACK_LEN]) -> Result<HelloStatus> {
    const W: &str = "hello acknowledgement";
    if u32_at(b, 0) != HELLO_ACK_MAGIC || b[4] != VERSION {
        return Err(malformed(W, "bad magic or version"));
    }
    if b[6..8] != [0, 0] {
        return Err(malformed(W, "reserved bits set"));
    }
    match b[5] {
        0 => Ok(HelloStatus::Ok),
        1 => Ok(HelloStatus::NoSuchQp),
        2 => Ok(HelloStatus::QpInError),
        3 => Ok(HelloStatus::AuthFailed),
        4 => Ok(HelloStatus::PeerNotAllowed),
        5 => Ok(HelloStatus::AlreadyConnected),
        s => Err(malformed(W, format!("unknown status {s}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: [u8; TOKEN_LEN] = [7; TOKEN_LEN];

    #[test]
    fn a_hello_made_with_the_token_verifies_and_round_trips() {
        let ch = Challenge::fresh().unwrap();
        assert_eq!(Challenge::decode(&ch.encode()).unwrap(), ch);
        for psk in [None, Some(&b"shared secret"[..])] {
            let h = Hello::answer(&ch, 3, 9, &TOKEN, psk);
            let back = Hello::decode(&h.encode()).unwrap();
            assert_eq!(back, h);
            assert!(back.verify(&ch, &TOKEN, psk));
        }
    }

    #[test]
    fn a_wrong_token_psk_nonce_or_qp_number_fails() {
        let ch = Challenge::fresh().unwrap();
        let h = Hello::answer(&ch, 3, 9, &TOKEN, None);
        assert!(!h.verify(&ch, &[8; TOKEN_LEN], None), "other token");
        assert!(!h.verify(&ch, &TOKEN, Some(b"k")), "PSK on one side only");
        let replayed = Challenge::fresh().unwrap();
        assert!(
            !h.verify(&replayed, &TOKEN, None),
            "replay under a new nonce"
        );
        let mut moved = h;
        moved.src_qpn = 4;
        assert!(!moved.verify(&ch, &TOKEN, None), "QP number changed");
        let hp = Hello::answer(&ch, 3, 9, &TOKEN, Some(b"k1"));
        assert!(!hp.verify(&ch, &TOKEN, Some(b"k2")), "other PSK");
        let mut flipped = hp;
        flipped.mac[31] ^= 1;
        assert!(
            !flipped.verify(&ch, &TOKEN, Some(b"k1")),
            "one bit of the MAC"
        );
    }

    #[test]
    fn decoders_reject_garbage() {
        let ch = Challenge::fresh().unwrap();
        let mut b = ch.encode();
        b[6] = 1;
        assert!(Challenge::decode(&b).is_err());
        let mut h = Hello::answer(&ch, 1, 2, &TOKEN, None).encode();
        h[5] = 2;
        assert!(Hello::decode(&h).is_err());
        h[5] = 0;
        h[4] = 1;
        assert!(Hello::decode(&h).is_err(), "version 1 hellos are refused");
        let mut a = encode_hello_ack(HelloStatus::AuthFailed);
        assert_eq!(decode_hello_ack(&a).unwrap(), HelloStatus::AuthFailed);
        a[5] = 6;
        assert!(decode_hello_ack(&a).is_err());
    }
}
