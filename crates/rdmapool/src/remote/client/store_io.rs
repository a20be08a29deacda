//! What the object store (`crate::store`) asks of the pool client: the nodes it may use,
//! and one-sided operations on their regions below the level of [`RemotePtr`]s (the
//! store's index and blocks are laid out by the store itself, docs/STORE.md), and block
//! allocation in the store's own chunks (table entries `STORE_TAG | id`).
//!
//! Every call names the node's incarnation as the store last learned it, and is refused
//! with [`Error::StalePointer`] if the node has restarted since: offsets into a
//! predecessor's memory are never used on its successor.

use super::chunks::{Alloc, Answer, Free, Io};
use super::node::Books;
use super::ops::timed;
use super::{Node, PoolClient};
use crate::fabric::{AccessFlags, Mr, RegisteredMemory, Shared};
use crate::remote::layout::{largest_object, size_class, Layout};
use crate::remote::RemotePtr;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A node as the store sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoreNode {
    pub(crate) node: u32,
    pub(crate) incarnation: u64,
    pub(crate) layout: Layout,
    /// Draining: it takes no new blocks.
    pub(crate) draining: bool,
    /// Whether this client reaches it now (a member that is down stays one of the keys'
    /// replicas: gets read around it, puts on its keys fail until it answers again).
    pub(crate) up: bool,
    /// An isolated node: the store there is this client's own namespace (its own index
    /// and blocks, under its own windows), docs/STORE.md section 2.
    pub(crate) isolated: bool,
}

/// The servers the store places keys over: the membership as this client knows it, not
/// the servers it reaches now (docs/STORE.md section 4).
#[derive(Debug, Clone, Default)]
pub(crate) struct StoreView {
    /// Every member this client has joined, up or down, by id: the isolated ones if there
    /// is any (a tenant's store), else all.
    pub(crate) nodes: Vec<StoreNode>,
    /// Members never reached since this client connected (address, why): their node ids
    /// are unknown, so no key can be placed for a put while there are any.
    pub(crate) unreached: Vec<(std::net::SocketAddr, String)>,
}

impl PoolClient {
    /// The members the store places keys over, up or down, and those never reached. Where
    /// some members are isolated, only those: a tenant's keys live in its own namespace on
    /// each, and never in a shared index another tenant could write (docs/STORE.md
    /// section 4).
    pub(crate) fn store_view(&self) -> StoreView {
        let nodes = self.shared.nodes.lock();
        let tenant = nodes.values().any(|n| n.windows.is_some());
        let mut nodes: Vec<StoreNode> = nodes
            .values()
            .filter(|n| n.windows.is_some() == tenant)
            .map(|n| StoreNode {
                node: n.desc.node,
                incarnation: n.desc.incarnation,
                layout: n.desc.layout,
                draining: n.draining.load(Ordering::Relaxed),
                up: n.down.lock().is_none(),
                isolated: n.windows.is_some(),
            })
            .collect();
        nodes.sort_by_key(|n| n.node);
        StoreView {
            nodes,
            unreached: self.shared.unreachable.lock().clone(),
        }
    }

    /// The members the store reaches now.
    pub(crate) fn store_nodes(&self) -> Vec<StoreNode> {
        let mut v = self.store_view().nodes;
        v.retain(|n| n.up);
        v
    }

    /// Whether no server that may hold an older version of a key can come back unseen:
    /// every node this client knows is up, none was never reached, and none that left the
    /// membership in the last [`DEPARTED_MEMORY`](super::DEPARTED_MEMORY) may come back
    /// under its old incarnation without a repair having seen it (tombstones are cleared
    /// only then, docs/STORE.md section 8).
    pub(crate) fn store_all_up(&self) -> bool {
        let mut departed = self.shared.departed.lock();
        departed.retain(|&(_, _, since)| since.elapsed() < super::DEPARTED_MEMORY);
        departed.is_empty()
            && self
                .shared
                .nodes
                .lock()
                .values()
                .all(|n| n.down.lock().is_none())
            && self.shared.unreachable.lock().is_empty()
    }

    /// A repair that left nothing deferred, failed or unreadable has seen every member:
    /// the departed nodes that are members again under their old incarnation no longer
    /// hold anything it did not repair.
    pub(crate) fn store_settle_departed(&self) {
        let nodes = self.shared.nodes.lock();
        self.shared.departed.lock().retain(|&(n, inc, _)| {
            !nodes
                .get(&n)
                .is_some_and(|x| x.desc.incarnation == inc && x.down.lock().is_none())
        });
    }

    /// This client's id.
    pub fn client_id(&self) -> u64 {
        self.shared.id
    }

    /// A registered buffer of at least `len` bytes: from the client's staging pool (made on
    /// first use; every class up to 2 MiB), or registered now when the pool has none free or
    /// `len` is larger.
    fn staging(&self, len: usize) -> Result<Mr<Shared>> {
        let s = &self.shared;
        let pool = match s.store_buffers.get() {
            Some(p) => Some(p),
            None => crate::buf::BufferPool::new(s.pd.clone(), crate::buf::PoolConfig::default())
                .ok()
                .map(|p| s.store_buffers.get_or_init(|| p)),
        };
        if let Some(Ok(buf)) = pool.map(|p| p.alloc(len)) {
            return Ok(buf.into_shared());
        }
        Ok(s.pd
            .alloc_mr(len.max(8), AccessFlags::LOCAL_WRITE)?
            .into_shared())
    }

    fn store_node(&self, node: u32, incarnation: u64) -> Result<Arc<Node>> {
        let n = self
            .shared
            .nodes
            .lock()
            .get(&node)
            .cloned()
            .ok_or_else(|| Error::NodeDown {
                node,
                reason: "not a member of the pool any more".into(),
            })?;
        if n.desc.incarnation != incarnation {
            return Err(Error::StalePointer {
                node,
                incarnation,
                current: n.desc.incarnation,
            });
        }
        n.check_up()?;
        Ok(n)
    }

    /// Waits until `deadline` without holding a thread (see `ops::Sleep`).
    pub(crate) async fn sleep_until(&self, deadline: std::time::Instant) {
        super::ops::Sleep {
            timers: &self.shared.timers,
            deadline,
            timer: None,
        }
        .await
    }

    /// Performs one operation of a word-level machine (the store's index root) on `node`.
    pub(crate) async fn store_io(&self, node: u32, incarnation: u64, io: Io) -> Result<Answer> {
        let n = self.store_node(node, incarnation)?;
        self.shared.perform(&n, io).await
    }

    /// `len` bytes at `at` of `node`'s region, in one READ.
    pub(crate) async fn store_read(
        &self,
        node: u32,
        incarnation: u64,
        at: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        let n = self.store_node(node, incarnation)?;
        let s = &self.shared;
        let size = usize::try_from(len).map_err(|_| Error::OutOfBounds {
            offset: at,
            len,
            limit: n.desc.layout.len,
        })?;
        let buf = self.staging(size)?;
        let remote = s.at(&n, at, len, false).await?;
        let op = n.qp.read(buf, 0, size as u32, remote);
        let (r, buf) = timed(&s.timers, &n, op).await;
        s.seen(&n, r)?;
        let mut out = vec![0; size];
        buf.read_at(0, &mut out)?;
        Ok(out)
    }

    /// Many READs `(node, incarnation, at, len)` at once: per node, lists of up to its
    /// send-queue depth, each with one doorbell and one completion (a pool batch); the
    /// nodes' lists run at the same time. `None` for a READ that could not be made or whose
    /// list failed (its node is then marked down, as for a single READ).
    pub(crate) async fn store_reads(&self, reads: &[(u32, u64, u64, u64)]) -> Vec<Option<Vec<u8>>> {
        let s = &self.shared;
        let mut out: Vec<Option<Vec<u8>>> = vec![None; reads.len()];
        // Per node: the node, and its reads (index, buffer, length, remote address).
        type Staged = (usize, Mr<Shared>, u32, crate::fabric::RemoteAddr);
        let mut groups: Vec<(Arc<Node>, Vec<Staged>)> = Vec::new();
        for (i, &(node, incarnation, at, len)) in reads.iter().enumerate() {
            let staged = async {
                let n = match groups.iter().find(|(n, _)| n.desc.node == node) {
                    Some((n, _)) if n.desc.incarnation == incarnation => n.clone(),
                    _ => self.store_node(node, incarnation)?,
                };
                let size = u32::try_from(len).map_err(|_| Error::OutOfBounds {
                    offset: at,
                    len,
                    limit: u64::from(u32::MAX),
                })?;
                let buf = self.staging(size as usize)?;
                let remote = s.at(&n, at, len, false).await?;
                Ok::<_, Error>((n, (i, buf, size, remote)))
            }
            .await;
            if let Ok((n, read)) = staged {
                match groups.iter_mut().find(|(g, _)| g.desc.node == n.desc.node) {
                    Some((_, list)) => list.push(read),
                    None => groups.push((n, vec![read])),
                }
            }
        }
        let mut lists = Vec::new();
        for (n, staged) in groups {
            let depth = n.qp.qp().capacity().send.max(1) as usize;
            let mut rest = staged.into_iter().peekable();
            while rest.peek().is_some() {
                let list: Vec<Staged> = rest.by_ref().take(depth).collect();
                let n = n.clone();
                lists.push(async move {
                    let mut index = Vec::with_capacity(list.len());
                    let mut ops = Vec::with_capacity(list.len());
                    for (i, buf, size, remote) in list {
                        index.push((i, size));
                        ops.push((crate::fabric::WrOp::Read { remote }, buf, 0, size));
                    }
                    let (r, bufs) = timed(&s.timers, &n, n.qp.batch(ops)).await;
                    let ok = s.seen(&n, r).is_ok();
                    index
                        .into_iter()
                        .zip(bufs)
                        .map(|((i, size), buf)| {
                            let bytes = ok.then(|| {
                                let mut v = vec![0; size as usize];
                                buf.read_at(0, &mut v).ok().map(|_| v)
                            });
                            (i, bytes.flatten())
                        })
                        .collect::<Vec<_>>()
                });
            }
        }
        for done in futures_util::future::join_all(lists).await {
            for (i, bytes) in done {
                out[i] = bytes;
            }
        }
        out
    }

    /// Writes `parts`, one after another, at `at` of `node`'s region, in one WRITE.
    pub(crate) async fn store_write(
        &self,
        node: u32,
        incarnation: u64,
        at: u64,
        parts: &[&[u8]],
    ) -> Result<()> {
        let n = self.store_node(node, incarnation)?;
        let s = &self.shared;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let buf = self.staging(len)?;
        let mut off = 0;
        for p in parts {
            buf.write_at(off, p)?;
            off += p.len();
        }
        let remote = s.at(&n, at, len as u64, true).await?;
        let op = n.qp.write(buf, 0, len as u32, remote);
        let (r, _) = timed(&s.timers, &n, op).await;
        s.seen(&n, r)?;
        Ok(())
    }

    /// Writes `head` (small pieces, one after another, through a staging buffer) at `at` of
    /// `node`'s region, and the bytes of `value` right after them straight from `value`'s
    /// memory (no copy): two WRITEs at once on the node's connection.
    pub(crate) async fn store_write_from(
        &self,
        node: u32,
        incarnation: u64,
        at: u64,
        head: &[&[u8]],
        value: &Mr<Shared>,
    ) -> Result<()> {
        let n = self.store_node(node, incarnation)?;
        let s = &self.shared;
        let head_len: usize = head.iter().map(|p| p.len()).sum();
        let buf = self.staging(head_len)?;
        let mut off = 0;
        for p in head {
            buf.write_at(off, p)?;
            off += p.len();
        }
        let value_len = value.len();
        let to_head = s.at(&n, at, head_len as u64, true).await?;
        let to_value = s
            .at(&n, at + head_len as u64, value_len as u64, true)
            .await?;
        let head_op = timed(&s.timers, &n, n.qp.write(buf, 0, head_len as u32, to_head));
        let value_op = timed(
            &s.timers,
            &n,
            n.qp.write(value.clone(), 0, value_len as u32, to_value),
        );
        let ((r1, _), (r2, _)) = futures_util::future::join(head_op, value_op).await;
        s.seen(&n, r1)?;
        s.seen(&n, r2)?;
        Ok(())
    }

    /// READs `head_len` bytes at `at` of `node`'s region (returned), and the `len` bytes
    /// right after them straight into `out` at `out_offset` (no copy): two READs at once.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn store_read_into(
        &self,
        node: u32,
        incarnation: u64,
        at: u64,
        head_len: u64,
        out: &Mr<Shared>,
        out_offset: usize,
        len: u64,
    ) -> Result<Vec<u8>> {
        let n = self.store_node(node, incarnation)?;
        let s = &self.shared;
        let head = head_len as usize;
        let buf = self.staging(head)?;
        let from_head = s.at(&n, at, head_len, false).await?;
        let from_value = s.at(&n, at + head_len, len, false).await?;
        let head_op = timed(&s.timers, &n, n.qp.read(buf, 0, head as u32, from_head));
        let value_op = timed(
            &s.timers,
            &n,
            n.qp.read(out.clone(), out_offset, len as u32, from_value),
        );
        let ((r1, buf), (r2, _)) = futures_util::future::join(head_op, value_op).await;
        s.seen(&n, r1)?;
        s.seen(&n, r2)?;
        let mut bytes = vec![0; head];
        buf.read_at(0, &mut bytes)?;
        Ok(bytes)
    }

    /// Compare-and-swap of the word at `at` of `node`'s region; the old value.
    pub(crate) async fn store_cas(
        &self,
        node: u32,
        incarnation: u64,
        at: u64,
        expected: u64,
        swap: u64,
    ) -> Result<u64> {
        let n = self.store_node(node, incarnation)?;
        let s = &self.shared;
        let remote = s.at(&n, at, 8, true).await?;
        s.cas(&n, remote, expected, swap).await
    }

    /// A block of `len` bytes in one of this client's store chunks on `node` (claiming a
    /// chunk `STORE_TAG | id` when none has room); `None` when the node has no room.
    pub(crate) async fn store_alloc(
        &self,
        node: u32,
        incarnation: u64,
        len: u64,
    ) -> Result<Option<u64>> {
        let n = self.store_node(node, incarnation)?;
        let chunk = n.desc.layout.chunk_size;
        let class = size_class(len, chunk).ok_or(Error::Core(crate::CoreError::OutOfLimits {
            what: "store block bytes (one object per chunk at most)",
            value: len,
            min: 1,
            max: largest_object(chunk),
        }))?;
        self.shared
            .drive_in(&n, Books::Store, Alloc::new(class))
            .await
    }

    /// Frees the block at `offset` of `node` (any client may).
    pub(crate) async fn store_free(&self, node: u32, incarnation: u64, offset: u64) -> Result<()> {
        let n = self.store_node(node, incarnation)?;
        let ptr = RemotePtr {
            node,
            offset,
            len: 1,
            incarnation,
        };
        let object = self.shared.check_object(&n, ptr, true).await?;
        self.shared
            .drive_in(&n, Books::Store, Free::new(ptr, object))
            .await
    }
}
