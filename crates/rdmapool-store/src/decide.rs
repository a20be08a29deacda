//! The store's decisions from what a client read, without I/O (docs/STORE.md sections 5
//! and 6): which slots of a bucket may hold a key, which verified block answers a get, what
//! version a put writes, and whether a replica's slot is to be replaced.

use super::format::{decode_block, Block, KeyHash, Slot, Version};

/// Slots per bucket (one 64-byte READ).
pub const SLOTS_PER_BUCKET: usize = 8;

/// The slots of a bucket (its words as read) whose fingerprint is the key's: the candidates
/// to READ and verify, with their positions in the bucket.
pub fn candidates(h: KeyHash, bucket: &[u64]) -> Vec<(usize, Slot)> {
    let fp = h.fingerprint();
    bucket
        .iter()
        .take(SLOTS_PER_BUCKET)
        .enumerate()
        .filter_map(|(i, &w)| Slot::from_word(w).map(|s| (i, s)))
        .filter(|(_, s)| s.fingerprint == fp)
        .collect()
}

/// The first empty slot of a bucket, for a key no replica holds.
pub fn empty_slot(bucket: &[u64]) -> Option<usize> {
    bucket.iter().take(SLOTS_PER_BUCKET).position(|&w| w == 0)
}

/// A verified block found for a key: which replica and slot it came from, and the block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The node it was read from.
    pub node: u32,
    /// Its slot's position in the bucket.
    pub slot: usize,
    /// The slot's word as read.
    pub word: u64,
    /// The block.
    pub block: Block,
}

/// Verifies the bytes read for each candidate; blocks of other keys, torn or damaged ones
/// are left out (each is "not this object", docs/STORE.md section 3).
pub fn verify<'a>(
    key: &[u8],
    reads: impl IntoIterator<Item = (u32, usize, u64, &'a [u8])>,
) -> Vec<Found> {
    reads
        .into_iter()
        .filter_map(|(node, slot, word, bytes)| {
            decode_block(bytes, key).ok().map(|block| Found {
                node,
                slot,
                word,
                block,
            })
        })
        .collect()
}

/// What answers a get: the found block with the highest version, on whichever replica.
/// `None` when nothing was found; a tombstone found is returned (it means "removed").
pub fn newest(found: &[Found]) -> Option<&Found> {
    found.iter().max_by_key(|f| f.block.version)
}

/// The version a put by `writer` writes, after the newest it found (or none).
pub fn next_version(newest: Option<Version>, writer: u64) -> Version {
    Version {
        seq: newest.map_or(1, |v| v.seq.saturating_add(1)),
        writer,
    }
}

/// Whether a replica's slot holding `present` (or nothing) is to be replaced by `ours`:
/// only a lower version is (every replica converges to the highest, promise 3).
pub fn replaces(present: Option<Version>, ours: Version) -> bool {
    present.is_none_or(|p| p < ours)
}

#[cfg(test)]
mod tests {
    use super::super::format::{encode_block, Kind};
    use super::*;

    #[test]
    fn a_get_takes_the_newest_verified_block_and_skips_the_rest() {
        let h = KeyHash::of(b"k");
        let old = encode_block(b"k", b"old", Version { seq: 1, writer: 5 }, Kind::Value).unwrap();
        let new = encode_block(b"k", b"new", Version { seq: 2, writer: 3 }, Kind::Value).unwrap();
        let other = encode_block(b"q", b"zzz", Version { seq: 9, writer: 3 }, Kind::Value).unwrap();
        let mut torn = new.clone();
        let last = torn.len() - 1;
        torn[last] ^= 1;
        let slot = |o| Slot::new(h, o, 80).unwrap().word();
        let bucket = [0, slot(64), 0, slot(128), slot(256), 7, 0, slot(512)];
        let c = candidates(h, &bucket);
        assert_eq!(c.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [1, 3, 4, 7]);
        assert_eq!(empty_slot(&bucket), Some(0));
        let found = verify(
            b"k",
            [
                (1, 1, bucket[1], &old[..]),
                (2, 3, bucket[3], &torn[..]),
                (1, 4, bucket[4], &other[..]),
                (2, 7, bucket[7], &new[..]),
            ],
        );
        assert_eq!(found.len(), 2);
        let best = newest(&found).unwrap();
        assert_eq!((best.node, best.slot), (2, 7));
        assert_eq!(&new[best.block.value.clone()], b"new");
    }

    #[test]
    fn versions_order_by_seq_then_writer_and_only_lower_ones_are_replaced() {
        let v = |seq, writer| Version { seq, writer };
        assert_eq!(next_version(None, 4), v(1, 4));
        assert_eq!(next_version(Some(v(7, 9)), 4), v(8, 4));
        assert!(replaces(None, v(1, 1)));
        assert!(replaces(Some(v(1, 9)), v(2, 1)));
        assert!(
            replaces(Some(v(2, 1)), v(2, 3)),
            "same seq: the higher writer wins"
        );
        assert!(!replaces(Some(v(2, 3)), v(2, 3)));
        assert!(!replaces(Some(v(3, 0)), v(2, 9)));
    }
}
