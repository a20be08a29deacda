//! What a [`Put`](super::Put) asks of its caller and is answered with: the steps, their
//! operations, the replies, and how a put ended.

use crate::format::{Version, HEADER_LEN};
use crate::lookup::Read;

/// A WRITE of a block: `header`, then the key, then the value, at `at` of `node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockWrite {
    pub(crate) node: u32,
    pub(crate) at: u64,
    pub(crate) header: [u8; HEADER_LEN],
}

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
}

/// What the put wants next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PutStep {
    /// Perform these READs at once; answer [`Reply::Bytes`].
    Read(Vec<Read>),
    /// Allocate a block of `len` bytes on each node; answer [`Reply::Offsets`].
    Alloc { nodes: Vec<u32>, len: u64 },
    /// Perform these WRITEs at once; answer [`Reply::Done`].
    Write(Vec<BlockWrite>),
    /// Perform these swaps at once; answer [`Reply::Words`] (each swap's old value).
    Swap(Vec<Swap>),
    /// Finished.
    Done(PutDone),
}

/// The answers to a step, in the order it asked (`None`/`false`: that operation failed).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reply<'a> {
    /// Nothing yet (the first call).
    Start,
    /// The bytes of each READ.
    Bytes(&'a [Option<&'a [u8]>]),
    /// The offset of each allocated block.
    Offsets(&'a [Option<u64>]),
    /// Whether each WRITE landed.
    Done(&'a [bool]),
    /// The old value of each swap.
    Words(&'a [Option<u64>]),
}
