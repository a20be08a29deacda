//! The pool's public seam for libraries that lay out server memory themselves (the object
//! store, crate `rdmapool-store`, is one): [`PoolClient::regions`] gives a [`Regions`] handle with
//! the members as this client knows them, one-sided operations on their regions below the
//! level of [`RemotePtr`]s (reads, batched reads, writes, zero-copy writes and reads,
//! compare-and-swap, and the word-level [`Io`] steps of the pool's own machines), and
//! block allocation in this client's **durable chunks**: chunk-table entries
//! [`DURABLE_TAG`](crate::remote::layout::DURABLE_TAG)` | id`, which no lease expiry
//! reclaims, so what is written there outlives the client's lease (PROTOCOL.md 7.3).
//!
//! Every operation names the node's incarnation as the caller last learned it, and is
//! refused with [`Error::StalePointer`] if the node has restarted since: offsets into a
//! predecessor's memory are never used on its successor. Layout facts (the chunk table,
//! client slots, the chunk header's magic) are the public constants and [`Layout`] of
//! [`crate::remote::layout`].
//!
//! What the pool promises a user of this seam: a READ, WRITE or CAS reported done was
//! done on that incarnation's memory; blocks from [`Regions::alloc`] are in chunks of
//! this client's durable tag and are never handed to another client until freed with
//! [`Regions::free`]; a member that is down stays listed (up = false) until it leaves the
//! membership.

use super::chunks::{Alloc, Free, Object};
use super::node::Books;
use super::ops::timed;
use super::{Node, PoolClient};
use crate::fabric::{AccessFlags, Mr, RegisteredMemory, Shared};
use crate::remote::layout::{largest_object, size_class, Layout};
use crate::remote::step::{Answer, Io, Machine, Op, Step};
use crate::remote::RemotePtr;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A member of the pool as a user of raw regions sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionNode {
    /// Its node id.
    pub node: u32,
    /// The incarnation this client knows (operations name it).
    pub incarnation: u64,
    /// Its region's layout.
    pub layout: Layout,
    /// Draining: it takes no new blocks.
    pub draining: bool,
    /// Whether this client reaches it now (a member that is down stays listed until it
    /// leaves the membership).
    pub up: bool,
    /// An isolated node (PROTOCOL.md 7.6): this client reaches only its own chunks there,
    /// through windows of its own.
    pub isolated: bool,
}

/// The membership as this client knows it, not the servers it reaches now.
#[derive(Debug, Clone, Default)]
pub struct Members {
    /// Every member this client has joined, up or down, by id: the isolated ones if there
    /// is any, else all.
    pub nodes: Vec<RegionNode>,
    /// Members never reached since this client connected (address, why): their node ids
    /// are unknown.
    pub unreached: Vec<(std::net::SocketAddr, String)>,
}

/// What an operation of a node's list answers from ([`Regions::perform`]).
/// The READs of one step on one node up to this many bytes in all are staged in one buffer
/// of the client's staging pool (its largest class).
const BULK_FROM_POOL: usize = 2 << 20;

/// The largest READ staging region a client keeps for its next step (larger ones are
/// registered for their step and let go).
const BULK_KEPT: usize = 16 << 20;

/// Where the READs of one step on one node land ([`Regions::read_staging`]).
struct ReadStaging {
    buf: Mr<Shared>,
    /// A region of its own (not a pool buffer): kept for later steps once they end.
    own: bool,
}

enum Staged {
    /// A READ of this many bytes into its buffer, at this offset of it.
    Read(usize, usize),
    /// A compare-and-swap, whose old value lands in its buffer.
    Cas,
    /// A WRITE (the last of a head and a payload).
    Written,
    /// A head's WRITE, answered by its payload's after it.
    Skip,
}

/// What [`Io::WriteWithPayload`] writes after its head ([`Regions::perform`]).
#[derive(Clone, Copy)]
pub enum Payload<'a> {
    /// Nothing (a step without such writes).
    None,
    /// These bytes, one part after another.
    Bytes(&'a [&'a [u8]]),
    /// A registered buffer's bytes, written from it without a copy.
    Mr(&'a Mr<Shared>),
    /// Where each [`Io::ReadInto`] of the step lands: a registered buffer and the offset in
    /// it, by the operation's `into`.
    Into(&'a [(&'a Mr<Shared>, usize)]),
    /// One payload per operation of the step, by its position in the step's list (a step
    /// that gathers the operations of several machines, each with its own payload:
    /// [`Regions::drive_many`]). Nested `Each` is no payload.
    Each(&'a [Payload<'a>]),
}

impl<'a> Payload<'a> {
    /// The payload of the step's operation `index`: its own under [`Payload::Each`]
    /// ([`Payload::None`] past the end, or nested), else this one.
    pub fn of(self, index: usize) -> Payload<'a> {
        match self {
            Payload::Each(all) => match all.get(index) {
                Some(Payload::Each(_)) | None => Payload::None,
                Some(&p) => p,
            },
            other => other,
        }
    }
}

/// Raw, one-sided access to the regions of a [`PoolClient`]'s members (see the module's
/// text). A copy of a reference: cheap to make, and its futures own it.
#[derive(Clone, Copy)]
pub struct Regions<'a> {
    pool: &'a PoolClient,
}

impl PoolClient {
    /// The pool's regions, for a library that lays out server memory itself (the module
    /// [`regions`](crate::remote::regions)).
    pub fn regions(&self) -> Regions<'_> {
        Regions { pool: self }
    }

    /// This client's id.
    pub fn client_id(&self) -> u64 {
        self.shared.id
    }
}

impl<'a> Regions<'a> {
    /// The members, up or down, and those never reached. Where some members are isolated,
    /// only those: a tenant's data lives in its own chunks on each, and never in memory
    /// another tenant could write (docs/STORE.md section 4).
    pub fn members(self) -> Members {
        let nodes = self.pool.shared.nodes.lock();
        let tenant = nodes.values().any(|n| n.windows.is_some());
        let mut nodes: Vec<RegionNode> = nodes
            .values()
            .filter(|n| n.windows.is_some() == tenant)
            .map(|n| RegionNode {
                node: n.desc.node,
                incarnation: n.desc.incarnation,
                layout: n.desc.layout,
                draining: n.draining.load(Ordering::Relaxed),
                up: n.down.lock().is_none(),
                isolated: n.windows.is_some(),
            })
            .collect();
        nodes.sort_by_key(|n| n.node);
        Members {
            nodes,
            unreached: self.pool.shared.unreachable.lock().clone(),
        }
    }

    /// The members this client reaches now.
    pub fn up_nodes(self) -> Vec<RegionNode> {
        let mut v = self.members().nodes;
        v.retain(|n| n.up);
        v
    }

    /// Whether no server that may hold an older version of a key can come back unseen:
    /// every node this client knows is up, none was never reached, and none that left the
    /// membership in the last [`DEPARTED_MEMORY`](crate::remote::DEPARTED_MEMORY) may come back
    /// under its old incarnation without a repair having seen it (tombstones are cleared
    /// only then, docs/STORE.md section 8).
    pub fn all_up(self) -> bool {
        let mut departed = self.pool.shared.departed.lock();
        departed.retain(|&(_, _, since)| since.elapsed() < crate::remote::DEPARTED_MEMORY);
        departed.is_empty()
            && self
                .pool
                .shared
                .nodes
                .lock()
                .values()
                .all(|n| n.down.lock().is_none())
            && self.pool.shared.unreachable.lock().is_empty()
    }

    /// Forgets the members that left and came back under their old incarnation (see
    /// [`Regions::all_up`]): call it once a pass over every member has seen what they hold
    /// (the store's repair that left nothing deferred, failed or unreadable).
    pub fn settle_departed(self) {
        let nodes = self.pool.shared.nodes.lock();
        self.pool.shared.departed.lock().retain(|&(n, inc, _)| {
            !nodes
                .get(&n)
                .is_some_and(|x| x.desc.incarnation == inc && x.down.lock().is_none())
        });
    }

    /// A registered buffer of at least `len` bytes ([`super::Shared::staging`]).
    fn staging(self, len: usize) -> Result<Mr<Shared>> {
        self.pool.shared.staging(len)
    }

    /// A buffer of `len` bytes from the client's staging pool ([`super::Shared::pooled`]).
    fn pooled(self, len: usize) -> Result<Mr<Shared>> {
        self.pool.shared.pooled(len)
    }

    /// The staging buffer of `total` bytes of READs of one step on one node: a pool buffer
    /// when one class holds them all, else the region kept from an earlier such step if it
    /// is large enough, else a new region (a step's READs register memory at most once,
    /// never once per READ).
    fn read_staging(self, total: usize) -> Result<ReadStaging> {
        if total <= BULK_FROM_POOL {
            if let Ok(buf) = self.pooled(total) {
                return Ok(ReadStaging { buf, own: false });
            }
        }
        let fits = {
            let mut kept = self.pool.shared.bulk_staging.lock();
            // The smallest kept region that holds them all.
            let best = (0..kept.len())
                .filter(|&i| kept[i].len() >= total)
                .min_by_key(|&i| kept[i].len());
            best.map(|i| kept.swap_remove(i))
        };
        let buf = match fits {
            Some(buf) => buf,
            None => self
                .pool
                .shared
                .pd
                .alloc_mr(
                    total.checked_next_power_of_two().unwrap_or(total),
                    AccessFlags::LOCAL_WRITE,
                )?
                .into_shared(),
        };
        Ok(ReadStaging { buf, own: true })
    }

    /// Keeps a step's READ staging that nothing uses any more for the next steps whose
    /// READs need a region of their own: when it is a region of its own and the kept
    /// regions stay within [`BULK_KEPT`] bytes with it (else it is let go).
    fn keep_read_staging(self, staging: ReadStaging) {
        let ReadStaging { buf, own: true } = staging else {
            return;
        };
        let mut kept = self.pool.shared.bulk_staging.lock();
        if kept.iter().map(|k| k.len()).sum::<usize>() + buf.len() <= BULK_KEPT {
            kept.push(buf);
        }
    }

    fn node(self, node: u32, incarnation: u64) -> Result<Arc<Node>> {
        let n = self
            .pool
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

    /// Waits until `deadline` on the pool's timers (the engine's clock, not a thread).
    pub async fn sleep_until(self, deadline: std::time::Instant) {
        super::ops::Sleep {
            timers: &self.pool.shared.timers,
            deadline,
            timer: None,
        }
        .await
    }

    /// Performs one word-level operation on `node`'s region, as the pool's own machines'
    /// driver does (a compare-and-swap of a chunk-table entry of an isolated node goes
    /// through the server).
    ///
    /// # Errors
    /// [`Error::StalePointer`] for another incarnation, [`Error::NodeDown`], and the
    /// operation's own errors; [`Io::WriteWithPayload`] and [`Io::Alloc`] are refused
    /// (they are [`Regions::perform`]'s).
    pub async fn io(self, node: u32, incarnation: u64, io: Io) -> Result<Answer> {
        let n = self.node(node, incarnation)?;
        self.pool.shared.perform(&n, io).await
    }

    /// The real driver of the [`step`](crate::remote::step) vocabulary: performs `ops`
    /// at once, every node's at the incarnation `incarnation_of` gives it, and answers
    /// each in order. Each node's operations go out **in order, as one list with one
    /// doorbell** (lists as deep as its send queue, one after another), so RC ordering
    /// holds between them: a WRITE, then a compare-and-swap that publishes what it wrote,
    /// then a READ that sees both. Allocations run beside the lists. A compare-and-swap of
    /// an isolated node's chunk-table entry goes through its server, so a node's list
    /// holding one is performed an operation at a time. [`Io::WriteWithPayload`] writes its
    /// head and then `payload`: its bytes one after another, or a registered buffer's,
    /// written from it without a copy.
    ///
    /// An operation whose node is down or gone (NodeDown, StalePointer, a list whose
    /// completion failed) answers [`Answer::Failed`], and so does every operation of the
    /// node's list after one that failed (RC flushes them); an allocation with no room
    /// answers `Offset(None)`. Any other error (a refusal: an object too large, an offset
    /// out of bounds or out of an isolated tenant's windows) fails the whole step with
    /// that error.
    ///
    /// # Errors
    /// That refusal.
    pub async fn perform(
        self,
        ops: &[Op],
        incarnation_of: impl Fn(u32) -> u64,
        payload: Payload<'_>,
    ) -> Result<Vec<Answer>> {
        // The nodes, in the order the step first names them (a step names a few).
        let mut nodes: Vec<u32> = Vec::with_capacity(4);
        let mut allocs = false;
        for op in ops {
            if matches!(op.io, Io::Alloc { .. }) {
                allocs = true;
            } else if !nodes.contains(&op.node) {
                nodes.push(op.node);
            }
        }
        if let ([node], false) = (&nodes[..], allocs) {
            // One node's list: its answers are the step's. (Boxed: a list's state is large,
            // and every future that awaits this one would carry it, and move it.)
            return Box::pin(self.perform_in_order(*node, incarnation_of(*node), ops, payload))
                .await;
        }
        let lists = futures_util::future::join_all(
            nodes
                .iter()
                .map(|&node| self.perform_in_order(node, incarnation_of(node), ops, payload)),
        );
        let allocated = futures_util::future::join_all(
            ops.iter()
                .enumerate()
                .filter(|(_, op)| matches!(op.io, Io::Alloc { .. }))
                .map(|(i, op)| {
                    let inc = incarnation_of(op.node);
                    async move { (i, self.perform_one(op, inc, payload.of(i)).await) }
                }),
        );
        let (lists, allocated) = futures_util::future::join(lists, allocated).await;
        let mut out = vec![Answer::Failed; ops.len()];
        for (&node, answers) in nodes.iter().zip(lists) {
            let mut answers = answers?.into_iter();
            for (i, op) in ops.iter().enumerate() {
                if op.node == node && !matches!(op.io, Io::Alloc { .. }) {
                    out[i] = answers.next().unwrap_or(Answer::Failed);
                }
            }
        }
        for (i, answer) in allocated {
            out[i] = answer?;
        }
        Ok(out)
    }

    /// The operations of `ops` on `node` (but allocations), in order as lists with one
    /// doorbell each: their answers, in that order.
    async fn perform_in_order(
        self,
        node: u32,
        incarnation: u64,
        ops: &[Op],
        payload: Payload<'_>,
    ) -> Result<Vec<Answer>> {
        // The node's operations, each with its own payload.
        let list = || {
            ops.iter()
                .enumerate()
                .filter(move |(_, op)| op.node == node && !matches!(op.io, Io::Alloc { .. }))
                .map(move |(i, op)| (op, payload.of(i)))
        };
        let count = list().count();
        let failed = || vec![Answer::Failed; count];
        let down = |e: &Error| matches!(e, Error::NodeDown { .. } | Error::StalePointer { .. });
        let n = match self.node(node, incarnation) {
            Ok(n) => n,
            Err(e) if down(&e) => return Ok(failed()),
            Err(e) => return Err(e),
        };
        let table_entry = |io: &Io| {
            let l = n.desc.layout;
            matches!(io, Io::Cas { at, .. } if at.checked_sub(l.table_offset).is_some_and(|rel| {
                rel / crate::remote::layout::TABLE_ENTRY < l.chunk_count
                    && l.table_entry(rel / crate::remote::layout::TABLE_ENTRY) == *at
            }))
        };
        if n.windows.is_some() && list().any(|(op, _)| table_entry(&op.io)) {
            let mut out = Vec::with_capacity(count);
            for (op, payload) in list() {
                out.push(self.perform_one(op, incarnation, payload).await?);
            }
            return Ok(out);
        }
        // Every READ lands in one staging buffer, one after another: one registered buffer
        // per step and node, however many READs it has.
        let read_lens = || {
            list().filter_map(|(op, _)| match op.io {
                Io::Read { len, .. } => Some(len),
                _ => None,
            })
        };
        let read_bytes = read_lens().fold(0u64, u64::saturating_add);
        let reads_into = match usize::try_from(read_bytes) {
            _ if read_lens().next().is_none() => None,
            Ok(total) => match self.read_staging(total.max(8)) {
                Ok(buf) => Some(buf),
                Err(e) if down(&e) => return Ok(failed()),
                Err(e) => return Err(e),
            },
            Err(_) => {
                return Err(Error::OutOfBounds {
                    offset: 0,
                    len: read_bytes,
                    limit: usize::MAX as u64,
                })
            }
        };
        // Stage every operation: its work requests, and what answers it (the last of them).
        let staged = async {
            let s = &self.pool.shared;
            let mut wrs: Vec<(crate::fabric::WrOp, Mr<Shared>, usize, u32)> =
                Vec::with_capacity(count + 1);
            let mut read_at = 0;
            for (op, payload) in list() {
                let size = |len: u64, at: u64| {
                    u32::try_from(len).map_err(|_| Error::OutOfBounds {
                        offset: at,
                        len,
                        limit: u64::from(u32::MAX),
                    })
                };
                match &op.io {
                    Io::Read { at, len } => {
                        let len32 = size(*len, *at)?;
                        let Some(ReadStaging { buf, .. }) = &reads_into else {
                            unreachable!("a step with a READ has its staging")
                        };
                        let remote = s.at(&n, *at, *len, false).await?;
                        let op = crate::fabric::WrOp::Read { remote };
                        wrs.push((op, buf.clone(), read_at, len32));
                        read_at += len32 as usize;
                    }
                    Io::ReadInto { at, len, into } => {
                        let len32 = size(*len, *at)?;
                        let (out, offset) = destination(payload, *into, len32)?;
                        let remote = s.at(&n, *at, *len, false).await?;
                        wrs.push((
                            crate::fabric::WrOp::Read { remote },
                            out.clone(),
                            offset,
                            len32,
                        ));
                    }
                    Io::Cas { at, expected, swap } => {
                        let buf = self.staging(8)?;
                        let remote = s.at(&n, *at, 8, true).await?;
                        let op = crate::fabric::WrOp::CompareSwap {
                            remote,
                            compare: *expected,
                            swap: *swap,
                        };
                        wrs.push((op, buf, 0, 8));
                    }
                    Io::FetchAdd { at, add } => {
                        let buf = self.staging(8)?;
                        let remote = s.at(&n, *at, 8, true).await?;
                        let op = crate::fabric::WrOp::FetchAdd { remote, add: *add };
                        wrs.push((op, buf, 0, 8));
                    }
                    Io::Write { at, bytes } => {
                        let len = size(bytes.len() as u64, *at)?;
                        let buf = self.staging(bytes.len())?;
                        buf.write_at(0, bytes)?;
                        let remote = s.at(&n, *at, u64::from(len), true).await?;
                        let op = crate::fabric::WrOp::Write { remote, imm: None };
                        wrs.push((op, buf, 0, len));
                    }
                    Io::WriteWithPayload { at, head } => {
                        let (bytes, value): (&[&[u8]], _) = match payload {
                            Payload::None | Payload::Into(_) | Payload::Each(_) => (&[], None),
                            Payload::Bytes(parts) => (parts, None),
                            Payload::Mr(value) => (&[], Some(value)),
                        };
                        let staged_len = head.len() + bytes.iter().map(|p| p.len()).sum::<usize>();
                        let len = size(staged_len as u64, *at)?;
                        let buf = self.staging(staged_len)?;
                        buf.write_at(0, head)?;
                        let mut off = head.len();
                        for p in bytes {
                            buf.write_at(off, p)?;
                            off += p.len();
                        }
                        let remote = s.at(&n, *at, u64::from(len), true).await?;
                        let op = crate::fabric::WrOp::Write { remote, imm: None };
                        wrs.push((op, buf, 0, len));
                        if let Some(value) = value {
                            let value_at = at + u64::from(len);
                            let value_len = size(value.len() as u64, value_at)?;
                            let remote = s.at(&n, value_at, u64::from(value_len), true).await?;
                            let op = crate::fabric::WrOp::Write { remote, imm: None };
                            wrs.push((op, value.clone(), 0, value_len));
                        }
                    }
                    Io::Alloc { .. } => unreachable!("allocations are performed beside the lists"),
                }
            }
            Ok::<_, Error>(wrs)
        };
        let wrs = match staged.await {
            Ok(x) => x,
            // A list with a hole in it would break the order it promises: none of it goes.
            Err(e) if down(&e) => return Ok(failed()),
            Err(e) => return Err(e),
        };
        let s = &self.pool.shared;
        let depth = n.qp.qp().capacity().send.max(1) as usize;
        let mut out = Vec::with_capacity(count);
        // What answers each work request, in the order they were staged.
        let mut read_at = 0;
        let mut kinds = list().flat_map(|(op, payload)| {
            let (first, second) = match (&op.io, payload) {
                (Io::Read { len, .. }, _) => {
                    let at = read_at;
                    read_at += *len as usize;
                    (Staged::Read(at, *len as usize), None)
                }
                (Io::ReadInto { .. }, _) => (Staged::Written, None),
                (Io::Cas { .. } | Io::FetchAdd { .. }, _) => (Staged::Cas, None),
                (Io::WriteWithPayload { .. }, Payload::Mr(_)) => {
                    (Staged::Skip, Some(Staged::Written))
                }
                _ => (Staged::Written, None),
            };
            std::iter::once(first).chain(second)
        });
        let mut ok = true;
        let mut wrs = wrs;
        while !wrs.is_empty() {
            // Lists as deep as the send queue; most steps fit in one.
            let list = if wrs.len() > depth {
                let rest = wrs.split_off(depth);
                std::mem::replace(&mut wrs, rest)
            } else {
                std::mem::take(&mut wrs)
            };
            let sent = list.len();
            // After a list that failed, the rest is not sent (RC would flush it).
            let bufs = if ok {
                let (r, bufs) = timed(&s.timers, &n, n.qp.batch(list)).await;
                ok = s.seen(&n, r).is_ok();
                ok.then_some(bufs)
            } else {
                None
            };
            let mut bufs = bufs.map(Vec::into_iter);
            for _ in 0..sent {
                let Some(kind) = kinds.next() else { break };
                let buf = bufs.as_mut().and_then(Iterator::next);
                let answer = match (buf, kind) {
                    (_, Staged::Skip) => continue,
                    (None, _) => Answer::Failed,
                    (Some(b), Staged::Read(at, len)) => {
                        let mut v = vec![0; len];
                        b.read_at(at, &mut v)
                            .map_or(Answer::Failed, |()| Answer::Bytes(v))
                    }
                    (Some(b), Staged::Cas) => b.read_u64(0).map_or(Answer::Failed, Answer::Word),
                    (Some(_), Staged::Written) => Answer::Written,
                };
                out.push(answer);
            }
        }
        // Every list of the step has ended: nothing is in flight into the READs' buffer.
        if let Some(buf) = reads_into {
            self.keep_read_staging(buf);
        }
        Ok(out)
    }

    /// One operation of [`Regions::perform`] other than a read.
    async fn perform_one(self, op: &Op, incarnation: u64, payload: Payload<'_>) -> Result<Answer> {
        let node = op.node;
        let answer = match &op.io {
            // An isolated node whose quota for this tenant is used up has no room either.
            Io::Alloc { len } => match self.alloc(node, incarnation, *len).await {
                Err(Error::RemoteExhausted { .. }) => Ok(Answer::Offset(None)),
                other => other.map(Answer::Offset),
            },
            Io::ReadInto { at, len, into } => {
                let len32 = u32::try_from(*len).map_err(|_| Error::OutOfBounds {
                    offset: *at,
                    len: *len,
                    limit: u64::from(u32::MAX),
                })?;
                let (out, offset) = destination(payload, *into, len32)?;
                let n = self.node(node, incarnation)?;
                let s = &self.pool.shared;
                let remote = s.at(&n, *at, *len, false).await?;
                let op = n.qp.read(out.clone(), offset, len32, remote);
                let (r, _) = timed(&s.timers, &n, op).await;
                s.seen(&n, r).map(|_| Answer::Written)
            }
            Io::WriteWithPayload { at, head } => match payload {
                Payload::None | Payload::Into(_) | Payload::Each(_) => {
                    self.write(node, incarnation, *at, &[head]).await
                }
                Payload::Bytes(parts) => {
                    let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
                    all.push(head);
                    all.extend_from_slice(parts);
                    self.write(node, incarnation, *at, &all).await
                }
                Payload::Mr(value) => {
                    self.write_from(node, incarnation, *at, &[head], value)
                        .await
                }
            }
            .map(|()| Answer::Written),
            Io::Write { at, bytes } => self
                .write(node, incarnation, *at, &[bytes])
                .await
                .map(|()| Answer::Written),
            // As the pool's own machines' compare-and-swaps: a chunk-table entry of an
            // isolated node is swapped through its server.
            Io::Cas { .. } | Io::FetchAdd { .. } => self.io(node, incarnation, op.io.clone()).await,
            Io::Read { at, len } => self
                .read(node, incarnation, *at, *len)
                .await
                .map(Answer::Bytes),
        };
        match answer {
            Ok(a) => Ok(a),
            Err(Error::NodeDown { .. } | Error::StalePointer { .. }) => Ok(Answer::Failed),
            Err(e) => Err(e),
        }
    }

    /// Runs `machine` to its end with [`Regions::perform`] (see it for `incarnation_of`
    /// and `payload`), sleeping on the pool's timers where it asks to. A machine that asks
    /// to [`Wait`](Step::Wait) for another task is called again at once: no task of this
    /// seam holds anything a machine waits for.
    ///
    /// # Errors
    /// The machine's, and [`Regions::perform`]'s; the machine is then abandoned.
    pub async fn drive<M: Machine<Context = ()>>(
        self,
        machine: &mut M,
        incarnation_of: impl Fn(u32) -> u64,
        payload: Payload<'_>,
    ) -> Result<M::Output> {
        let mut answers = Vec::new();
        loop {
            let step = match machine
                .advance(&mut (), std::time::Instant::now(), &answers)
                .map(Step::listed)
            {
                Ok(s) => s,
                Err(e) => {
                    machine.abandon(&mut ());
                    return Err(e);
                }
            };
            answers = match step {
                Step::Do(ops) => match self.perform(&ops, &incarnation_of, payload).await {
                    Ok(a) => a,
                    Err(e) => {
                        machine.abandon(&mut ());
                        return Err(e);
                    }
                },
                Step::Sleep(until) => {
                    self.sleep_until(until).await;
                    Vec::new()
                }
                Step::One(_) | Step::Wait => Vec::new(),
                Step::Done(out) => return Ok(out),
            };
        }
    }

    /// Drives `machines` to their ends together: each round, the operations every one of
    /// them asks for go out as **one step** ([`Regions::perform`]: per server, one list
    /// with one doorbell), each operation with its machine's payload (`payloads[i]` for
    /// machine `i`, [`Payload::None`] past the end), and each machine is given its own
    /// answers. N machines of a few rounds each take those few rounds, not N times them.
    /// A machine that asks to sleep sits out the rounds until its deadline (the others go
    /// on); one that asks for [`Step::One`] gets it in the next round's list. Their outputs,
    /// in their order.
    ///
    /// Operations of different machines on one server go out in one list, each machine's
    /// in its own order: a failed list fails the operations after the failure, whichever
    /// machine's they are (they answer [`Answer::Failed`], as for a single machine).
    ///
    /// # Errors
    /// Per machine: its own, or the step's when [`Regions::perform`] refused the whole step
    /// (every machine with operations in it gets that error; the others go on). A machine
    /// that fails is abandoned.
    pub async fn drive_many<M: Machine<Context = ()>>(
        self,
        machines: &mut [M],
        incarnation_of: impl Fn(u32) -> u64,
        payloads: &[Payload<'_>],
    ) -> Vec<Result<M::Output>> {
        let count = machines.len();
        let mut out: Vec<Option<Result<M::Output>>> = (0..count).map(|_| None).collect();
        let mut answers: Vec<Vec<Answer>> = vec![Vec::new(); count];
        let mut asleep: Vec<Option<std::time::Instant>> = vec![None; count];
        loop {
            let now = std::time::Instant::now();
            let mut ops: Vec<Op> = Vec::new();
            let mut each: Vec<Payload<'_>> = Vec::new();
            let mut asked: Vec<std::ops::Range<usize>> = vec![0..0; count];
            let mut again = false;
            for (i, machine) in machines.iter_mut().enumerate() {
                if out[i].is_some() || asleep[i].is_some_and(|until| now < until) {
                    continue;
                }
                asleep[i] = None;
                let step = machine.advance(&mut (), now, &answers[i]).map(Step::listed);
                answers[i].clear();
                match step {
                    Err(e) => {
                        machine.abandon(&mut ());
                        out[i] = Some(Err(e));
                    }
                    Ok(Step::Do(mine)) => {
                        let start = ops.len();
                        let payload = payloads.get(i).copied().unwrap_or(Payload::None);
                        each.extend(std::iter::repeat_n(payload, mine.len()));
                        ops.extend(mine);
                        asked[i] = start..ops.len();
                        again |= asked[i].is_empty();
                    }
                    Ok(Step::Sleep(until)) => asleep[i] = Some(until),
                    Ok(Step::One(_) | Step::Wait) => again = true,
                    Ok(Step::Done(o)) => out[i] = Some(Ok(o)),
                }
            }
            if out.iter().all(Option::is_some) {
                break;
            }
            if ops.is_empty() {
                if !again {
                    // Every machine left sleeps: until the first of them wakes.
                    if let Some(until) = asleep.iter().flatten().min() {
                        self.sleep_until(*until).await;
                    }
                }
                continue;
            }
            match self
                .perform(&ops, &incarnation_of, Payload::Each(&each))
                .await
            {
                Ok(mut all) => {
                    for (i, range) in asked.iter().enumerate().rev() {
                        if !range.is_empty() {
                            answers[i] = all.split_off(range.start);
                        }
                    }
                }
                Err(e) => {
                    for (i, range) in asked.iter().enumerate() {
                        if !range.is_empty() {
                            machines[i].abandon(&mut ());
                            out[i] = Some(Err(super::batch::same_error(&e)));
                        }
                    }
                }
            }
        }
        out.into_iter().flatten().collect()
    }

    /// READs `len` bytes at `at` of `node`'s region.
    ///
    /// # Errors
    /// As [`Regions::io`]; [`Error::OutOfBounds`] outside the region.
    pub async fn read(self, node: u32, incarnation: u64, at: u64, len: u64) -> Result<Vec<u8>> {
        let n = self.node(node, incarnation)?;
        let s = &self.pool.shared;
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

    /// READs each `(node, incarnation, at, len)` of `reads`, every node's at once and in
    /// lists as deep as its queue ([`Regions::perform`]): the bytes, `None` for one that
    /// failed.
    pub async fn reads(self, reads: &[(u32, u64, u64, u64)]) -> Vec<Option<Vec<u8>>> {
        let ops: Vec<Op> = reads
            .iter()
            .map(|&(node, _, at, len)| Op {
                node,
                io: Io::Read { at, len },
            })
            .collect();
        let incarnation_of = |node: u32| {
            reads
                .iter()
                .find(|r| r.0 == node)
                .map_or(0, |&(_, incarnation, _, _)| incarnation)
        };
        match self.perform(&ops, incarnation_of, Payload::None).await {
            Ok(answers) => answers
                .into_iter()
                .map(|a| match a {
                    Answer::Bytes(b) => Some(b),
                    _ => None,
                })
                .collect(),
            Err(_) => vec![None; reads.len()],
        }
    }

    /// Writes `parts`, one after another, at `at` of `node`'s region, in one WRITE.
    ///
    /// # Errors
    /// As [`Regions::read`].
    pub async fn write(self, node: u32, incarnation: u64, at: u64, parts: &[&[u8]]) -> Result<()> {
        let n = self.node(node, incarnation)?;
        let s = &self.pool.shared;
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
    ///
    /// # Errors
    /// As [`Regions::read`].
    pub async fn write_from(
        self,
        node: u32,
        incarnation: u64,
        at: u64,
        head: &[&[u8]],
        value: &Mr<Shared>,
    ) -> Result<()> {
        let n = self.node(node, incarnation)?;
        let s = &self.pool.shared;
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
    ///
    /// # Errors
    /// As [`Regions::read`].
    #[allow(clippy::too_many_arguments)]
    pub async fn read_into(
        self,
        node: u32,
        incarnation: u64,
        at: u64,
        head_len: u64,
        out: &Mr<Shared>,
        out_offset: usize,
        len: u64,
    ) -> Result<Vec<u8>> {
        let n = self.node(node, incarnation)?;
        let s = &self.pool.shared;
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
    ///
    /// # Errors
    /// As [`Regions::read`].
    pub async fn cas(
        self,
        node: u32,
        incarnation: u64,
        at: u64,
        expected: u64,
        swap: u64,
    ) -> Result<u64> {
        let n = self.node(node, incarnation)?;
        let s = &self.pool.shared;
        let remote = s.at(&n, at, 8, true).await?;
        s.cas(&n, remote, expected, swap).await
    }

    /// A block of `len` bytes in one of this client's durable chunks on `node` (claiming a
    /// chunk `DURABLE_TAG | id` when none has room); `None` when the node has no room.
    ///
    /// # Errors
    /// As [`Regions::read`]; [`CoreError::OutOfLimits`](crate::CoreError::OutOfLimits) for
    /// a block above the node's largest object.
    pub async fn alloc(self, node: u32, incarnation: u64, len: u64) -> Result<Option<u64>> {
        let n = self.node(node, incarnation)?;
        let chunk = n.desc.layout.chunk_size;
        let class = size_class(len, chunk).ok_or(Error::Core(crate::CoreError::OutOfLimits {
            what: "store block bytes (one object per chunk at most)",
            value: len,
            min: 1,
            max: largest_object(chunk),
        }))?;
        self.pool
            .shared
            .drive_in(&n, Books::Durable, Alloc::new(class))
            .await
    }

    /// Frees the block at `offset` of `node` (any client may: a durable block outlives its
    /// writer).
    ///
    /// # Errors
    /// As [`Regions::read`]; an offset that is no allocated block is refused typed, as a
    /// [`PoolClient::free`] of such a pointer is.
    pub async fn free(self, node: u32, incarnation: u64, offset: u64) -> Result<()> {
        let n = self.node(node, incarnation)?;
        let ptr = Self::block(node, incarnation, offset);
        let object = self
            .pool
            .shared
            .check_object(&n, Books::Durable, ptr, true)
            .await?;
        self.pool
            .shared
            .drive_in(&n, Books::Durable, Free::new(ptr, object))
            .await
            .map(drop)
    }

    /// [`Regions::free`] of the block at `offset` of `node` only if its first `head` bytes
    /// pass `still_its`: the caller's check that the block still holds what it meant to
    /// free (another client may have freed and reused it meanwhile). Those bytes are READ
    /// in the same round trip as the chunk header the free checks, so a free takes two
    /// round trips (one READ round, the swap), one less than a READ and then a free.
    /// `Ok(false)`: `still_its` refused, nothing was freed.
    ///
    /// # Errors
    /// As [`Regions::free`].
    pub async fn free_if(
        self,
        node: u32,
        incarnation: u64,
        offset: u64,
        head: u64,
        still_its: impl FnOnce(&[u8]) -> bool,
    ) -> Result<bool> {
        let n = self.node(node, incarnation)?;
        let ptr = Self::block(node, incarnation, offset);
        let shared = &self.pool.shared;
        let (bytes, object) = futures_util::future::join(
            self.read(node, incarnation, offset, head),
            shared.check_object(&n, Books::Durable, ptr, true),
        )
        .await;
        if !still_its(&bytes?) {
            return Ok(false);
        }
        shared
            .drive_in(&n, Books::Durable, Free::new(ptr, object?))
            .await?;
        Ok(true)
    }

    /// [`Regions::free_if`] of many blocks of `node` at once, each `(offset, head)`: their
    /// first `head` bytes are READ in one list, together with the chunk headers the frees
    /// check, and those that pass `still_its(i, bytes)` (`i` their position in `blocks`)
    /// are freed with **one swap per bitmap word** they share, the swaps of different words
    /// at once: two round trips whatever their number (frees one by one of blocks in one
    /// word would take one round trip each, every swap but one losing to another). A block
    /// whose READ or check fails, or whose bit is clear already, is left. Returns how many
    /// it freed.
    ///
    /// # Errors
    /// [`Error::StalePointer`] for another incarnation, [`Error::NodeDown`].
    pub async fn free_many_if(
        self,
        node: u32,
        incarnation: u64,
        blocks: &[(u64, u64)],
        still_its: impl Fn(usize, &[u8]) -> bool,
    ) -> Result<usize> {
        let n = self.node(node, incarnation)?;
        let shared = &self.pool.shared;
        let reads: Vec<Op> = blocks
            .iter()
            .map(|&(at, len)| Op {
                node,
                io: Io::Read { at, len },
            })
            .collect();
        let checks = futures_util::future::join_all(blocks.iter().map(|&(at, _)| {
            let ptr = Self::block(node, incarnation, at);
            shared.check_object(&n, Books::Durable, ptr, true)
        }));
        let (answers, objects) = futures_util::future::join(
            self.perform(&reads, |_| incarnation, Payload::None),
            checks,
        )
        .await;
        // The blocks to free, by bitmap word: the first one's pointer, and the objects.
        let mut words: Vec<(RemotePtr, Vec<Object>)> = Vec::new();
        for (i, (answer, object)) in answers?.iter().zip(objects).enumerate() {
            let (Some(bytes), Ok(object)) = (answer.bytes(), object) else {
                continue;
            };
            if !still_its(i, bytes) {
                continue;
            }
            let word = |o: &Object| (o.chunk, o.number / 64);
            match words
                .iter_mut()
                .find(|(_, os)| word(&os[0]) == word(&object))
            {
                Some((_, os)) => os.push(object),
                None => words.push((Self::block(node, incarnation, blocks[i].0), vec![object])),
            }
        }
        let freed = futures_util::future::join_all(words.iter().map(|(ptr, objects)| async {
            match Free::together(*ptr, objects) {
                Some(m) => shared.drive_in(&n, Books::Durable, m).await.unwrap_or(0),
                None => 0,
            }
        }))
        .await;
        Ok(freed.into_iter().map(|c| c as usize).sum())
    }

    /// The pointer a durable block's free checks.
    fn block(node: u32, incarnation: u64, offset: u64) -> RemotePtr {
        RemotePtr {
            node,
            offset,
            len: 1,
            incarnation,
        }
    }
}

/// Destination `into` of `payload` ([`Payload::Into`]), checked to hold `len` bytes at its
/// offset.
fn destination<'a>(payload: Payload<'a>, into: usize, len: u32) -> Result<(&'a Mr<Shared>, usize)> {
    let Payload::Into(dests) = payload else {
        return Err(Error::Core(crate::CoreError::Malformed {
            what: "read into a destination",
            reason: "the step's payload names no destinations".into(),
        }));
    };
    let &(out, offset) = dests.get(into).ok_or_else(|| {
        Error::Core(crate::CoreError::Malformed {
            what: "read into a destination",
            reason: format!("destination {into} of {}", dests.len()),
        })
    })?;
    if offset
        .checked_add(len as usize)
        .is_none_or(|end| end > out.len())
    {
        return Err(Error::Core(crate::CoreError::OutOfRange {
            what: "read into a destination",
            offset: offset as u64,
            len: u64::from(len),
            limit: out.len() as u64,
        }));
    }
    Ok((out, offset))
}
