//! What a [`Put`](super::Put) swaps and how it ended.

use crate::format::{Kind, Version};
use rdmapool_pool::remote::step::{Io, Op};

/// A compare-and-swap of the index word at `at` of `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swap {
    pub(crate) node: u32,
    pub(crate) at: u64,
    pub(crate) expected: u64,
    pub(crate) swap: u64,
    /// The version of the block `expected` names (`None`: an empty slot).
    pub(crate) replacing: Option<Version>,
}

impl Swap {
    /// The swap as an operation of the pool's step vocabulary.
    pub(crate) fn op(&self) -> Op {
        Op {
            node: self.node,
            io: Io::Cas {
                at: self.at,
                expected: self.expected,
                swap: self.swap,
            },
        }
    }
}

/// A block on a node, by offset.
pub(crate) type BlockAt = (u32, u64);

/// How a put ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PutDone {
    /// The version it published; `None` for a remove of a key no replica holds.
    pub(crate) version: Option<Version>,
    /// Blocks its swaps replaced, with the version each held: free them after the grace
    /// period.
    pub(crate) replaced: Vec<(u32, u64, Version)>,
    /// Its own blocks that were never published (a newer version got there first): free
    /// them now.
    pub(crate) unused: Vec<BlockAt>,
    /// The values of the striped versions (manifests) it superseded, one per version: their
    /// parts are garbage once the grace period has passed (docs/STORE.md section 9). Empty
    /// for a repair's copy.
    pub(crate) superseded: Vec<Vec<u8>>,
    /// The slot words it put into replicas' slots, by node: where the key is now.
    pub(crate) installed: Vec<(u32, u64)>,
    /// For a [fenced](super::Put::fenced) put, the fence word read on each node right
    /// after its swap there (`None`: the read failed), by node.
    pub(crate) fences: Vec<(u32, Option<u64>)>,
    /// The slots it put its block into, by node, as a hint for this client's next put of
    /// the key ([`Put::current`](super::Put::current)).
    pub(crate) seen: Vec<SlotSeen>,
    /// Blocks allocated for later puts ([`Put::spare`](super::Put::spare)): the caller's.
    pub(crate) spares: Vec<BlockAt>,
    /// Per swap it won, by node: the bytes the slot names now less those it named before
    /// (each word's length bound): a cache's usage (docs/STORE.md section 12).
    pub(crate) named_bytes: Vec<(u32, i64)>,
}

/// A replica's slot of a key as a client saw it (its own swap installed it, or a lookup
/// read it): the hint a put publishes from in one round trip
/// ([`Put::current`](super::Put::current)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotSeen {
    pub(crate) node: u32,
    /// The slot's position in the key's bucket.
    pub(crate) slot: usize,
    /// The word it held.
    pub(crate) word: u64,
    /// The version of the block that word names.
    pub(crate) version: Version,
    /// What that block held.
    pub(crate) kind: Kind,
}
