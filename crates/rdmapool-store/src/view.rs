//! The store's numbered view of the cluster (docs/STORE.md section 4, issue #40): which
//! servers the store places keys over, numbered, and written on each server where every
//! client reads it, so that clients that learn of a membership change at different moments
//! still place every key alike, and a put made under an older view is never acknowledged.
//!
//! The record lives in each server's header page, `[1024, 2048)` of its region
//! (PROTOCOL.md 7.3), all little-endian:
//!
//! | Off | Size | Meaning |
//! |---|---|---|
//! | 0 | 8 | the **fence word**: the view's number `v` (0: no view; the store then places keys over the membership) |
//! | 8 | 4 | `n`, the members' count (1 to [`MAX_IDS`]) |
//! | 12 | 4 | `m`, the previous view's members' count while data moves (0 once settled) |
//! | 16 | 4 | CRC-32 (IEEE) of bytes 0..16, then the ids |
//! | 20 | 4 | zero |
//! | 24 | 8·(n + m) | the members' node ids, ascending, then the previous members' |
//!
//! A changer writes bytes 8.. first, then swaps the fence word from the number it read to
//! the next; a reader reads the whole record at once and retries one whose CRC does not
//! hold (read between the two writes). A put READs the fence word of each replica after its
//! last swap there, on the same connection, and is acknowledged only if every word still
//! holds the view it placed the key by.

use rdmapool_pool::{CoreError, Error, Result};

/// Where the record starts in a server's region.
pub(crate) const VIEW_AT: u64 = 1024;
/// Bytes read to fetch a record whole.
pub(crate) const VIEW_LEN: u64 = 1024;
/// Bytes before the ids.
const HEAD: usize = 24;
/// The most ids a record holds (members and previous members together).
pub const MAX_IDS: usize = (VIEW_LEN as usize - HEAD) / 8;

/// A numbered view: the members the store places keys over, and the previous view's while
/// data moves from that placement to this one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct View {
    /// The view's number (0: none set; keys are placed over the membership).
    pub number: u64,
    /// The members' node ids, ascending.
    pub members: Vec<u32>,
    /// The previous view's members while data moves (empty once settled).
    pub previous: Vec<u32>,
}

impl View {
    /// Whether keys are still moving from the previous placement (gets read both).
    pub fn moving(&self) -> bool {
        !self.previous.is_empty()
    }

    /// The record's bytes.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let (n, m) = (self.members.len(), self.previous.len());
        if n == 0 || n + m > MAX_IDS {
            return Err(Error::Core(CoreError::OutOfLimits {
                what: "store view members (and previous members)",
                value: (n + m) as u64,
                min: 1,
                max: MAX_IDS as u64,
            }));
        }
        let mut b = vec![0u8; HEAD + 8 * (n + m)];
        b[0..8].copy_from_slice(&self.number.to_le_bytes());
        b[8..12].copy_from_slice(&(n as u32).to_le_bytes());
        b[12..16].copy_from_slice(&(m as u32).to_le_bytes());
        for (i, id) in self.members.iter().chain(&self.previous).enumerate() {
            b[HEAD + 8 * i..HEAD + 8 * i + 8].copy_from_slice(&u64::from(*id).to_le_bytes());
        }
        let crc = crc(&b);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        Ok(b)
    }

    /// The record in `bytes` (at least its length): `Ok(None)` for no view (a zero fence
    /// word); an error for a record that does not hold together (torn by a change in
    /// progress, or damaged).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Option<View>> {
        let bad = |reason: String| {
            Error::Core(CoreError::Malformed {
                what: "store view record",
                reason,
            })
        };
        if bytes.len() < HEAD {
            return Err(bad(format!("{} bytes, under {HEAD}", bytes.len())));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap_or([0; 4]));
        let number = u64::from_le_bytes(bytes[0..8].try_into().unwrap_or([0; 8]));
        if number == 0 {
            return Ok(None);
        }
        let (n, m) = (u32_at(8) as usize, u32_at(12) as usize);
        if n == 0 || n + m > MAX_IDS || bytes.len() < HEAD + 8 * (n + m) || u32_at(20) != 0 {
            return Err(bad(format!("{n} members and {m} previous, view {number}")));
        }
        let b = &bytes[..HEAD + 8 * (n + m)];
        if crc(b) != u32_at(16) {
            return Err(bad(format!("view {number}: its checksum does not hold")));
        }
        let mut ids = Vec::with_capacity(n + m);
        for i in 0..n + m {
            let id = u64::from_le_bytes(
                b[HEAD + 8 * i..HEAD + 8 * i + 8]
                    .try_into()
                    .unwrap_or([0; 8]),
            );
            ids.push(u32::try_from(id).map_err(|_| bad(format!("node id {id}")))?);
        }
        let previous = ids.split_off(n);
        Ok(Some(View {
            number,
            members: ids,
            previous,
        }))
    }

    /// The view after this one with `members` (sorted, deduplicated), data moving from
    /// this one's members.
    pub(crate) fn next(&self, members: &[u32], from: &[u32]) -> View {
        let mut members = members.to_vec();
        members.sort_unstable();
        members.dedup();
        let mut previous = from.to_vec();
        previous.sort_unstable();
        previous.dedup();
        View {
            number: self.number + 1,
            members,
            previous,
        }
    }

    /// This view, settled: no previous members.
    pub(crate) fn settled(&self) -> View {
        View {
            previous: Vec::new(),
            ..self.clone()
        }
    }
}

/// CRC-32 of bytes 0..16 and the ids (bytes 16..24 left out).
fn crc(record: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&record[..16]);
    h.update(&record[HEAD..]);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_torn_or_damaged_ones_are_errors() {
        let v = View {
            number: 7,
            members: vec![1, 2, 4],
            previous: vec![1, 2, 3],
        };
        let b = v.encode().unwrap();
        assert_eq!(b.len(), 24 + 6 * 8);
        let mut padded = b.clone();
        padded.resize(VIEW_LEN as usize, 0);
        assert_eq!(View::decode(&padded).unwrap(), Some(v.clone()));
        assert_eq!(View::decode(&[0; 1024]).unwrap(), None, "no view");
        // Torn: the next view's body under the old fence word.
        let mut torn = v.next(&[1, 2], &[1, 2, 4]).encode().unwrap();
        torn[0..8].copy_from_slice(&7u64.to_le_bytes());
        assert!(View::decode(&torn).is_err());
        for i in [8, 12, 16, 20, 30] {
            let mut bad = b.clone();
            bad[i] ^= 1;
            assert!(View::decode(&bad).is_err(), "byte {i} flipped");
        }
        assert!(View::default().encode().is_err(), "a view without members");
        let big = View {
            number: 1,
            members: (0..MAX_IDS as u32 + 1).collect(),
            previous: vec![],
        };
        assert!(big.encode().is_err());
        assert_eq!(v.settled().previous, Vec::<u32>::new());
        assert_eq!(v.next(&[3, 1, 3], &[1, 2]).members, vec![1, 3]);
    }
}
