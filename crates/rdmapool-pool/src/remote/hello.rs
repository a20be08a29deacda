//! A client's connection request (the hello), and how a client proves its id to a server
//! that has the cluster key. Byte layout: docs/PROTOCOL.md section 7.1.
//!
//! Each client id has its own key, derived from the cluster key ([`client_key`]): an
//! operator hands a tenant only the key of its id, so a tenant can prove that id and no
//! other, and a server (which holds the cluster key) derives any id's key itself. The proof
//! rides in the one message RDMA CM gives a requester (the connection request; the RTU
//! carries nothing), so it is made fresh by time rather than by a server nonce: it covers
//! the hello, whose random nonce a server accepts once ([`HelloGate`]), and a time within
//! [`MAX_CLOCK_SKEW`] of the server's clock. The server's proof in its accept is made under
//! the same client key.

use super::layout::LAYOUT_VERSION;
use crate::fabric::PreSharedKey;
use crate::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::HashMap;
use std::time::Duration;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of an encoded [`ClientHello`] without a proof.
pub const HELLO_LEN: usize = 32;
/// Bytes of an encoded [`ClientHello`] with the client's proof (fits RDMA CM's 54 bytes of
/// connection request private data).
pub const PROVEN_HELLO_LEN: usize = 48;
/// How far a proven hello's time may be from the server's clock, either way; a server
/// remembers the nonces it accepted for this long.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);
/// At most this many accepted nonces are remembered at once; a proven hello beyond them
/// (only holders of client keys can make one) is answered `busy`.
pub const MAX_REMEMBERED_HELLOS: usize = 1 << 16;

/// Hello flag (byte 3): a time (bytes 4..8) and a proof (bytes 32..48) follow.
const FLAG_PROOF: u8 = 1;
const PROOF_LEN: usize = PROVEN_HELLO_LEN - HELLO_LEN;
const CLIENT_KEY_LABEL: &[u8] = b"rdmapool pool client key v1";
const CLIENT_PROOF_LABEL: &[u8] = b"rdmapool pool client proof v1";

fn mac(key: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length")
}

/// The key of client id `client_id` in the cluster whose key is `cluster`: the 64 ASCII
/// bytes of the lowercase hex of HMAC-SHA256(cluster, "rdmapool pool client key v1" || id as
/// u64 LE). Text, so that a key file holding it (`rdma-tool client-key`) reads back as the
/// same key. Give a client this, not the cluster key, and it can prove its own id and no
/// other.
pub fn client_key(cluster: &PreSharedKey, client_id: u64) -> PreSharedKey {
    let mut m = mac(cluster.bytes());
    m.update(CLIENT_KEY_LABEL);
    m.update(&client_id.to_le_bytes());
    let hex: String = m
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    PreSharedKey::new(hex.as_bytes()).expect("64 bytes is long enough")
}

/// The text of a client key, to write to its file (64 hex digits).
pub fn client_key_text(key: &PreSharedKey) -> String {
    String::from_utf8_lossy(key.bytes()).into_owned()
}

/// A client's connection request: who it is, and a fresh nonce the server's proof covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientHello {
    /// The client's id (1 to [`MAX_CLIENT_ID`](super::MAX_CLIENT_ID); the same id after a
    /// restart finds its allocations).
    pub client_id: u64,
    /// Random for every connection: a server's proof of the cluster key covers it, so a
    /// recorded proof does not verify for another connection.
    pub nonce: [u8; 16],
}

impl ClientHello {
    /// A hello of `client_id` with a random nonce.
    pub fn new(client_id: u64) -> Result<Self> {
        let mut nonce = [0u8; 16];
        nonce[..8].copy_from_slice(&crate::util::random_nonzero()?.to_le_bytes());
        nonce[8..].copy_from_slice(&crate::util::random_nonzero()?.to_le_bytes());
        Ok(Self { client_id, nonce })
    }

    /// The 32 bytes of the connection request's private data, without a proof.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..2].copy_from_slice(b"RC");
        b[2] = LAYOUT_VERSION;
        b[8..16].copy_from_slice(&self.client_id.to_le_bytes());
        b[16..32].copy_from_slice(&self.nonce);
        b
    }

    /// The 48 bytes of a hello proven with the client's key `key` ([`client_key`]) at
    /// `unix_time` (seconds): the hello flagged and timed, then the first 16 bytes of
    /// HMAC-SHA256(key, label || those 32 bytes).
    pub fn encode_proven(&self, key: &PreSharedKey, unix_time: u64) -> [u8; PROVEN_HELLO_LEN] {
        let mut b = [0u8; PROVEN_HELLO_LEN];
        b[..HELLO_LEN].copy_from_slice(&self.encode());
        b[3] = FLAG_PROOF;
        b[4..8].copy_from_slice(&(unix_time.min(u32::MAX as u64) as u32).to_le_bytes());
        let mut m = mac(key.bytes());
        m.update(CLIENT_PROOF_LABEL);
        m.update(&b[..HELLO_LEN]);
        b[HELLO_LEN..].copy_from_slice(&m.finalize().into_bytes()[..PROOF_LEN]);
        b
    }

    /// Decodes and checks a hello, with or without a proof (which is not verified here:
    /// a server with the cluster key does).
    pub fn decode(b: &[u8]) -> Result<Self> {
        decode(b).map(|(h, _)| h)
    }
}

fn malformed(reason: &str) -> Error {
    Error::Core(crate::CoreError::Malformed {
        what: "pool client hello",
        reason: reason.into(),
    })
}

/// The hello, and its time and proof if it carries one.
fn decode(b: &[u8]) -> Result<(ClientHello, Option<u32>)> {
    if b.len() < 2 || &b[0..2] != b"RC" {
        return Err(malformed("bad magic"));
    }
    let proven = b.get(3) == Some(&FLAG_PROOF);
    let want = if proven { PROVEN_HELLO_LEN } else { HELLO_LEN };
    if b.len() != want {
        return Err(malformed("bad length"));
    }
    if b[2] != LAYOUT_VERSION || (!proven && b[3..8] != [0; 5]) {
        return Err(malformed("bad version, flags or reserved bytes"));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&b[8..16]);
    let client_id = u64::from_le_bytes(id);
    if !(1..=super::MAX_CLIENT_ID).contains(&client_id) {
        return Err(malformed("client id 0, or with bit 63 set"));
    }
    let mut nonce = [0u8; 16];
    nonce.copy_from_slice(&b[16..32]);
    let time = proven.then(|| u32::from_le_bytes([b[4], b[5], b[6], b[7]]));
    Ok((ClientHello { client_id, nonce }, time))
}

/// Why a server refused a hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It does not decode.
    Malformed(String),
    /// It carries no proof, or one that does not verify under its id's key, or one seen
    /// before, or one whose time is too far from ours: answered alike (`unauthenticated`),
    /// so that only a holder of the id's key learns more.
    Unauthenticated(String),
    /// Too many accepted nonces to remember: try again later.
    Busy,
}

/// A server's check of hellos: with the cluster key, every hello must carry a proof under
/// its id's key, with a time within [`MAX_CLOCK_SKEW`] of now, and a nonce not accepted
/// before (remembered for twice the skew, at most [`MAX_REMEMBERED_HELLOS`]). Without a
/// key, every well-formed hello passes. Pure: the caller gives the time.
pub(crate) struct HelloGate {
    cluster: Option<PreSharedKey>,
    /// Accepted nonces and the unix time after which they are forgotten.
    seen: HashMap<[u8; 16], u64>,
}

impl HelloGate {
    pub(crate) fn new(cluster: Option<PreSharedKey>) -> Self {
        Self {
            cluster,
            seen: HashMap::new(),
        }
    }

    /// Checks hello `b` at `now` (unix seconds): its decoded form, or why it is refused.
    pub(crate) fn admit(
        &mut self,
        b: &[u8],
        now: u64,
    ) -> std::result::Result<ClientHello, Refusal> {
        let (hello, time) = decode(b).map_err(|e| Refusal::Malformed(e.to_string()))?;
        let Some(cluster) = &self.cluster else {
            return Ok(hello);
        };
        let Some(time) = time else {
            return Err(Refusal::Unauthenticated("no proof of a client key".into()));
        };
        let mut m = mac(client_key(cluster, hello.client_id).bytes());
        m.update(CLIENT_PROOF_LABEL);
        m.update(&b[..HELLO_LEN]);
        m.verify_truncated_left(&b[HELLO_LEN..])
            .map_err(|_| Refusal::Unauthenticated("the proof does not verify".into()))?;
        let skew = MAX_CLOCK_SKEW.as_secs();
        if (time as u64).abs_diff(now) > skew {
            return Err(Refusal::Unauthenticated(format!(
                "its time is {} s from ours (at most {skew} s)",
                (time as u64).abs_diff(now)
            )));
        }
        self.seen.retain(|_, until| *until >= now);
        if self.seen.contains_key(&hello.nonce) {
            return Err(Refusal::Unauthenticated("a hello seen before".into()));
        }
        if self.seen.len() >= MAX_REMEMBERED_HELLOS {
            return Err(Refusal::Busy);
        }
        // A replay is refused while its time is within the skew of ours: for up to 2 skews.
        self.seen.insert(hello.nonce, time as u64 + skew);
        Ok(hello)
    }
}

/// Seconds since the Unix epoch, as this host's clock says.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn cluster() -> PreSharedKey {
        PreSharedKey::new(&[3; 32]).unwrap()
    }

    #[test]
    fn hellos_round_trip_with_and_without_a_proof() {
        let h = ClientHello::new(42).unwrap();
        assert_eq!(ClientHello::decode(&h.encode()).unwrap(), h);
        let proven = h.encode_proven(&client_key(&cluster(), 42), NOW);
        assert_eq!(ClientHello::decode(&proven).unwrap(), h);
        let zero = ClientHello {
            client_id: 0,
            nonce: [0; 16],
        };
        assert!(ClientHello::decode(&zero.encode()).is_err());
        let store_tag = ClientHello {
            client_id: 1 << 63,
            nonce: [0; 16],
        };
        assert!(
            ClientHello::decode(&store_tag.encode()).is_err(),
            "ids with bit 63 set name the store's chunks"
        );
        let top = ClientHello {
            client_id: crate::remote::MAX_CLIENT_ID,
            nonce: [0; 16],
        };
        assert_eq!(ClientHello::decode(&top.encode()).unwrap(), top);
        let mut b = h.encode();
        b[5] = 1;
        assert!(
            ClientHello::decode(&b).is_err(),
            "reserved bytes without the flag"
        );
        assert!(
            ClientHello::decode(&proven[..HELLO_LEN]).is_err(),
            "flag, no proof"
        );
        let mut unknown = proven;
        unknown[3] = 2;
        assert!(ClientHello::decode(&unknown).is_err(), "unknown flag");
    }

    #[test]
    fn a_server_with_the_key_admits_only_fresh_hellos_proven_for_their_own_id() {
        let mut gate = HelloGate::new(Some(cluster()));
        let h = ClientHello::new(42).unwrap();
        let good = h.encode_proven(&client_key(&cluster(), 42), NOW);
        assert_eq!(gate.admit(&good, NOW), Ok(h));
        let refused = |gate: &mut HelloGate, b: &[u8], now: u64| {
            matches!(gate.admit(b, now), Err(Refusal::Unauthenticated(_)))
        };
        assert!(refused(&mut gate, &good, NOW + 1), "the same hello again");
        // Another id's key (a tenant proving an id not its own), another cluster's, none.
        let h7 = ClientHello::new(7).unwrap();
        assert!(refused(
            &mut gate,
            &h7.encode_proven(&client_key(&cluster(), 42), NOW),
            NOW
        ));
        let other = PreSharedKey::new(&[4; 32]).unwrap();
        assert!(refused(
            &mut gate,
            &h7.encode_proven(&client_key(&other, 7), NOW),
            NOW
        ));
        assert!(refused(&mut gate, &h7.encode_proven(&cluster(), NOW), NOW));
        assert!(refused(&mut gate, &h7.encode(), NOW));
        // A changed id under a valid proof.
        let mut forged = h7.encode_proven(&client_key(&cluster(), 7), NOW);
        forged[8] = 8;
        assert!(refused(&mut gate, &forged, NOW));
        // Time: within the skew either way, and not beyond.
        let key7 = client_key(&cluster(), 7);
        let skew = MAX_CLOCK_SKEW.as_secs();
        for (t, ok) in [
            (NOW - skew, true),
            (NOW + skew, true),
            (NOW - skew - 1, false),
            (NOW + skew + 1, false),
        ] {
            let b = ClientHello::new(7).unwrap().encode_proven(&key7, t);
            assert_eq!(gate.admit(&b, NOW).is_ok(), ok, "time {t} at {NOW}");
        }
        // Without a key the gate checks form only.
        let mut open = HelloGate::new(None);
        assert!(open.admit(&h7.encode(), NOW).is_ok());
        assert!(open.admit(&good, NOW).is_ok());
        assert!(matches!(
            open.admit(b"nonsense", NOW),
            Err(Refusal::Malformed(_))
        ));
    }

    #[test]
    fn remembered_nonces_are_bounded_and_forgotten_after_the_window() {
        let mut gate = HelloGate::new(Some(cluster()));
        let key = client_key(&cluster(), 9);
        let h = ClientHello::new(9).unwrap();
        let b = h.encode_proven(&key, NOW);
        assert!(gate.admit(&b, NOW).is_ok());
        assert_eq!(gate.seen.len(), 1);
        // Past its window the replay is refused for its time, and the nonce is forgotten.
        let later = NOW + 2 * MAX_CLOCK_SKEW.as_secs() + 1;
        assert!(matches!(
            gate.admit(&b, later),
            Err(Refusal::Unauthenticated(_))
        ));
        let fresh = ClientHello::new(9).unwrap().encode_proven(&key, later);
        assert!(gate.admit(&fresh, later).is_ok());
        assert_eq!(gate.seen.len(), 1, "the old nonce is gone");
        for i in 0..MAX_REMEMBERED_HELLOS as u64 {
            let mut n = [0u8; 16];
            n[..8].copy_from_slice(&i.to_le_bytes());
            n[8] = 1;
            gate.seen.insert(n, later + 10);
        }
        let one_more = ClientHello::new(9).unwrap().encode_proven(&key, later);
        assert_eq!(gate.admit(&one_more, later), Err(Refusal::Busy));
    }

    #[test]
    fn client_keys_differ_by_id_and_cluster() {
        let a = client_key(&cluster(), 1);
        assert_eq!(a, client_key(&cluster(), 1));
        assert_ne!(a, client_key(&cluster(), 2));
        assert_ne!(a, client_key(&PreSharedKey::new(&[4; 32]).unwrap(), 1));
    }
}
