//! Striped values (docs/STORE.md section 9), without I/O: a value too large for one block
//! is split into parts, each stored as a block of its own **part key**, placed by that key
//! like any other (so a get reads the parts from several servers at once, and repair keeps
//! them at `r` replicas like any key). The object's own block is then a **manifest**
//! ([`Kind::Manifest`](super::format::Kind::Manifest)) that lists the parts.
//!
//! A part key names the object (its key's hash), the put (writer and a random nonce) and
//! the part's number, so every put writes parts no other put writes: parts are immutable
//! like every version, and a reader that holds a manifest reads exactly its parts or
//! learns they are gone (the object was replaced, and its parts cleared after the grace
//! period).

use super::format::{KeyHash, HEADER_LEN, MAX_VALUE_LEN};
use std::ops::Range;

/// The first bytes of every part key. Keys that start with them are refused from users.
pub const PART_PREFIX: &[u8; 8] = b"\0RDSPART";
/// Bytes of a part key: the prefix, the object key's hash, the writer, the nonce and the
/// part's number.
pub const PART_KEY_LEN: usize = 8 + 8 + 8 + 8 + 4;
/// Bytes a part's block adds to the part's value (header and part key).
pub const PART_OVERHEAD: u64 = (HEADER_LEN + PART_KEY_LEN) as u64;
/// The first bytes of a manifest.
pub const MANIFEST_MAGIC: [u8; 8] = *b"RDSMAN01";
/// Bytes of a manifest before its list of part checksums.
const MANIFEST_HEAD: usize = 48;

/// Whether `key` is a part key (users may not use such keys).
pub fn is_part_key(key: &[u8]) -> bool {
    key.starts_with(PART_PREFIX)
}

/// The key of part `index` of the value of `key` put by `writer` with `nonce`.
pub fn part_key(key: &[u8], writer: u64, nonce: u64, index: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(PART_KEY_LEN);
    k.extend_from_slice(PART_PREFIX);
    k.extend_from_slice(&KeyHash::of(key).0.to_le_bytes());
    k.extend_from_slice(&writer.to_le_bytes());
    k.extend_from_slice(&nonce.to_le_bytes());
    k.extend_from_slice(&index.to_le_bytes());
    k
}

/// A striped value's manifest: its length, how it is cut, whose parts, and each part's
/// CRC-32 (IEEE).
///
/// | Off | Size | Meaning |
/// |---|---|---|
/// | 0 | 8 | magic `"RDSMAN01"` |
/// | 8 | 8 | the value's length |
/// | 16 | 8 | part length (every part but the last; the last holds the rest) |
/// | 24 | 8 | the parts' writer |
/// | 32 | 8 | the parts' nonce |
/// | 40 | 4 | part count `n` |
/// | 44 | 4 | zero |
/// | 48 | 4`n` | each part's CRC-32 |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The value's length in bytes.
    pub total: u64,
    /// Bytes of every part but the last.
    pub part_len: u64,
    /// The client id of the put that wrote the parts.
    pub writer: u64,
    /// The put's random nonce.
    pub nonce: u64,
    /// Each part's CRC-32.
    pub crcs: Vec<u32>,
}

impl Manifest {
    /// The manifest of `value` cut into parts of `part_len` bytes, for a put by `writer`
    /// with `nonce`.
    pub fn new(value: &[u8], part_len: u64, writer: u64, nonce: u64) -> Self {
        let part_len = part_len.max(1);
        Self {
            total: value.len() as u64,
            part_len,
            writer,
            nonce,
            crcs: value
                .chunks(part_len as usize)
                .map(crc32fast::hash)
                .collect(),
        }
    }

    /// Where part `i` is in the value.
    pub fn range(&self, i: usize) -> Range<usize> {
        let start = (i as u64 * self.part_len).min(self.total);
        let end = (start + self.part_len).min(self.total);
        start as usize..end as usize
    }

    /// Every part's key, in order, for the object `key`.
    pub fn part_keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        (0..self.crcs.len() as u32)
            .map(|i| part_key(key, self.writer, self.nonce, i))
            .collect()
    }

    /// The manifest's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MANIFEST_HEAD + 4 * self.crcs.len());
        out.extend_from_slice(&MANIFEST_MAGIC);
        for w in [self.total, self.part_len, self.writer, self.nonce] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&(self.crcs.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        for c in &self.crcs {
            out.extend_from_slice(&c.to_le_bytes());
        }
        out
    }

    /// The manifest `bytes` hold; `None` unless every field is consistent (the part count
    /// is the value's length cut in parts, the bytes end after the last checksum).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let word = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
        let count = u32::from_le_bytes(bytes.get(40..44)?.try_into().ok()?) as usize;
        let (total, part_len) = (word(8)?, word(16)?);
        if bytes.get(..8)? != MANIFEST_MAGIC
            || bytes.get(44..48)? != [0; 4]
            || !(1..=MAX_VALUE_LEN).contains(&total)
            || part_len == 0
            || total.div_ceil(part_len) != count as u64
            || bytes.len() != MANIFEST_HEAD + 4 * count
        {
            return None;
        }
        Some(Self {
            total,
            part_len,
            writer: word(24)?,
            nonce: word(32)?,
            crcs: bytes[MANIFEST_HEAD..]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn part_keys_are_distinct_per_put_and_part_and_marked() {
        let a = part_key(b"big", 7, 1, 0);
        assert_eq!(a.len(), PART_KEY_LEN);
        assert!(is_part_key(&a) && !is_part_key(b"big"));
        assert_ne!(a, part_key(b"big", 7, 1, 1));
        assert_ne!(a, part_key(b"big", 7, 2, 0), "another put");
        assert_ne!(a, part_key(b"other", 7, 1, 0));
    }

    proptest! {
        /// A manifest decodes to what was encoded, its parts tile the value, and any
        /// truncation or a wrong count is refused.
        #[test]
        fn manifests_round_trip_and_tile_the_value(len in 1usize..5000, part in 1u64..700, cut in 0usize..100) {
            let value: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
            let m = Manifest::new(&value, part, 3, 99);
            let bytes = m.encode();
            prop_assert_eq!(Manifest::decode(&bytes), Some(m.clone()));
            let mut joined = Vec::new();
            for (i, crc) in m.crcs.iter().enumerate() {
                let r = m.range(i);
                prop_assert!(!r.is_empty());
                prop_assert_eq!(crc32fast::hash(&value[r.clone()]), *crc);
                joined.extend_from_slice(&value[r]);
            }
            prop_assert_eq!(joined, value);
            let cut = cut.min(bytes.len() - 1);
            prop_assert_eq!(Manifest::decode(&bytes[..bytes.len() - 1 - cut]), None);
            let mut wrong = bytes.clone();
            wrong[40] = wrong[40].wrapping_add(1);
            prop_assert_eq!(Manifest::decode(&wrong), None);
        }
    }
}
