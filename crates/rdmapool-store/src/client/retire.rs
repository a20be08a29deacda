//! The blocks a put, a remove or a repair replaced: kept until the grace period has passed,
//! then freed if they still hold what was retired (docs/STORE.md section 8).

use super::{incarnation, Store};
use crate::format::{peek, Version, HEADER_LEN};
use crate::lookup::Replica;
use futures_util::future::join_all;
use rdmapool_pool::Error;
use std::time::Instant;

/// A block waiting for its grace period to pass before it is freed, with what it held (the
/// free checks that it still holds it).
#[derive(Debug, Clone)]
pub(super) struct Retired {
    due: Instant,
    node: u32,
    incarnation: u64,
    at: u64,
    key: Vec<u8>,
    version: Version,
}

impl Store {
    /// Frees the replaced blocks whose grace period has passed, and clears the parts of
    /// replaced striped values whose grace period has passed; how many blocks.
    pub async fn flush_retired(&self) -> usize {
        self.flush_blocks().await + self.flush_parts().await
    }

    /// When the last of the blocks and parts this client retired comes due (the queues
    /// are in order of their due times), or `None` when none waits.
    pub(super) fn retired_due(&self) -> Option<Instant> {
        let blocks = self.retired.lock().back().map(|b| b.due);
        let parts = self.retired_parts.lock().back().map(|(t, _)| *t);
        blocks.max(parts)
    }

    async fn flush_blocks(&self) -> usize {
        let now = Instant::now();
        let due: Vec<Retired> = {
            let mut r = self.retired.lock();
            let n = r.iter().take_while(|b| now >= b.due).count();
            r.drain(..n).collect()
        };
        let freed = join_all(due.iter().map(|b| async move {
            // Free it only if it still holds what was retired: a block repair reclaimed
            // meanwhile (docs/STORE.md section 8) may hold someone else's object now.
            let head = (HEADER_LEN + b.key.len()) as u64;
            let bytes = self
                .pool
                .regions()
                .read(b.node, b.incarnation, b.at, head)
                .await?;
            match peek(&bytes) {
                Some(p) if p.key == b.key && p.version == b.version => {
                    self.pool.regions().free(b.node, b.incarnation, b.at).await
                }
                _ => Err(Error::NotAllocated(format!(
                    "store block at {} of node {}: reclaimed since it was retired",
                    b.at, b.node
                ))),
            }
        }))
        .await;
        // A block that cannot be freed now (its node is down, or restarted and its memory
        // gone) is left: repair reclaims unnamed blocks (docs/STORE.md section 8).
        freed.iter().filter(|r| r.is_ok()).count()
    }

    /// Queues blocks of `key` a put or a repair replaced, each `(node, incarnation, offset,
    /// version)`, to be freed after the grace period.
    pub(super) fn retire(
        &self,
        key: &[u8],
        blocks: impl IntoIterator<Item = (u32, u64, u64, Version)>,
    ) {
        let due = crate::timing::free_after(Instant::now(), self.cfg.grace);
        let mut q = self.retired.lock();
        for (node, incarnation, at, version) in blocks {
            q.push_back(Retired {
                due,
                node,
                incarnation,
                at,
                key: key.to_vec(),
                version,
            });
        }
    }

    /// The blocks this client will free after their grace period: `(node, offset)`.
    pub(super) fn retired_blocks(&self) -> std::collections::HashSet<(u32, u64)> {
        self.retired.lock().iter().map(|b| (b.node, b.at)).collect()
    }

    /// [`Store::retire`] of a put's replaced blocks on `replicas`.
    pub(super) fn retire_replaced(
        &self,
        key: &[u8],
        replicas: &[Replica],
        blocks: &[(u32, u64, Version)],
    ) {
        self.retire(
            key,
            blocks
                .iter()
                .map(|&(node, at, v)| (node, incarnation(replicas, node), at, v)),
        );
    }
}
