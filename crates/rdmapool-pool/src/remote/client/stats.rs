//! The pool as a client can see it, one-sided: READs of each server's lease slots, chunk
//! table and state word (what `rdma-tool pool stats` shows).

use super::{Node, PoolClient, Shared};
use crate::remote::layout::{self, CLIENT_SLOT, STATE_DRAINING, TABLE_ENTRY};
use crate::Result;

/// What one server's region says, read with one-sided READs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeStats {
    /// The node's id.
    pub node: u32,
    /// Bytes per chunk.
    pub chunk_size: u64,
    /// Chunks in the pool.
    pub chunks: u64,
    /// Chunks some client owns.
    pub chunks_owned: u64,
    /// Chunks nobody owns.
    pub chunks_free: u64,
    /// Client slots.
    pub lease_slots: u64,
    /// Clients holding a lease (an occupied slot).
    pub leases: u64,
    /// The server is draining: no new chunks are placed there.
    pub draining: bool,
}

/// Words per READ: 64 KiB at a time.
const READ_WORDS: usize = 8192;

impl Shared {
    /// `words` words at `base`, in READs of at most [`READ_WORDS`].
    async fn read_span(&self, node: &Node, base: u64, words: u64) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(words as usize);
        let mut done = 0u64;
        while done < words {
            let n = (words - done).min(READ_WORDS as u64);
            out.extend(self.read_words(node, base + done * 8, n as usize).await?);
            done += n;
        }
        Ok(out)
    }

    async fn node_stats(&self, node: &Node) -> Result<NodeStats> {
        let l = node.desc.layout;
        let slot_words = CLIENT_SLOT / 8;
        let slots = self
            .read_span(node, l.client_slot(0), l.client_count * slot_words)
            .await?;
        let entry_words = TABLE_ENTRY / 8;
        let table = self
            .read_span(node, l.table_entry(0), l.chunk_count * entry_words)
            .await?;
        let state = self.read_u64(node, layout::header::STATE).await?;
        let leases = slots
            .iter()
            .step_by(slot_words as usize)
            .filter(|&&w| w != 0)
            .count() as u64;
        let owned = table
            .iter()
            .step_by(entry_words as usize)
            .filter(|&&w| w != 0)
            .count() as u64;
        Ok(NodeStats {
            node: node.desc.node,
            chunk_size: l.chunk_size,
            chunks: l.chunk_count,
            chunks_owned: owned,
            chunks_free: l.chunk_count - owned,
            lease_slots: l.client_count,
            leases,
            draining: state == STATE_DRAINING,
        })
    }
}

impl PoolClient {
    /// Every live node's [`NodeStats`], read from its region now (one-sided: the server's
    /// CPU takes no part), by node id.
    pub async fn node_stats(&self) -> Result<Vec<NodeStats>> {
        let mut out = Vec::new();
        for node in self.shared.live_nodes() {
            out.push(self.shared.node_stats(&node).await?);
        }
        Ok(out)
    }
}
