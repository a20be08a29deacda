//! Pool batches: many small READs, WRITEs and atomics on remote pointers, posted per server
//! as one list (one doorbell, only the last request signalled, one completion).
//!
//! Each operation is checked on its own first (bounds, incarnation, object, node up), as
//! the single operations are; the ones that pass are grouped by server in the order they
//! were added, and each server's group is posted as lists of at most its send-queue depth.
//! The servers' lists run at the same time.

use super::{timed, PoolClient, Word};
use crate::cq::OpCompletion;
use crate::fabric::{Mr, RegisteredMemory, RemoteAddr, Shared as SharedView, WrOp};
use crate::remote::RemotePtr;
use crate::{Error, Result};
use std::sync::Arc;

/// One operation of a [`PoolBatch`], as added.
enum Op<B> {
    Write {
        ptr: RemotePtr,
        offset: u64,
        local: B,
        local_offset: usize,
        len: u32,
    },
    Read {
        ptr: RemotePtr,
        offset: u64,
        local: B,
        local_offset: usize,
        len: u32,
    },
    CompareAndSwap {
        ptr: RemotePtr,
        offset: u64,
        compare: u64,
        swap: u64,
    },
    FetchAndAdd {
        ptr: RemotePtr,
        offset: u64,
        add: u64,
    },
}

/// What one operation of a batch gave: its result, and its buffer back (READ and WRITE).
#[derive(Debug)]
pub struct BatchOutcome<B> {
    /// `Ok(None)` for a READ or WRITE that completed, `Ok(Some(old))` for an atomic (the
    /// word's value before it), or the operation's error (see [`PoolBatch::run`]).
    pub result: Result<Option<u64>>,
    /// The local buffer of a READ or WRITE (always given back, whatever the result).
    pub buffer: Option<B>,
}

/// Small pool operations collected to run together (see [`PoolClient::batch`]).
pub struct PoolBatch<'c, B> {
    client: &'c PoolClient,
    ops: Vec<Op<B>>,
}

/// The local side of one posted request: the caller's buffer, or a scratch word that an
/// atomic's old value lands in.
enum Local<B> {
    Caller(B),
    Word(Mr<SharedView>),
}

impl<B: RegisteredMemory> RegisteredMemory for Local<B> {
    fn addr(&self) -> u64 {
        match self {
            Local::Caller(b) => b.addr(),
            Local::Word(w) => w.addr(),
        }
    }
    fn len(&self) -> usize {
        match self {
            Local::Caller(b) => b.len(),
            Local::Word(w) => w.len(),
        }
    }
    fn lkey(&self) -> u32 {
        match self {
            Local::Caller(b) => b.lkey(),
            Local::Word(w) => w.lkey(),
        }
    }
    fn rkey(&self) -> u32 {
        match self {
            Local::Caller(b) => b.rkey(),
            Local::Word(w) => w.rkey(),
        }
    }
    fn sge(&self, offset: usize, len: u32) -> rdmapool_core::Result<crate::fabric::Sge> {
        match self {
            Local::Caller(b) => b.sge(offset, len),
            Local::Word(w) => w.sge(offset, len),
        }
    }
}

/// One request ready to post: where its outcome goes, and what it holds until completion.
struct Posted<B> {
    index: usize,
    op: WrOp,
    local: Local<B>,
    local_offset: usize,
    len: u32,
    word: Option<Word>,
}

/// A work request as [`AsyncQp::batch`](crate::cq::AsyncQp::batch) takes it.
type Wr<B> = (WrOp, Local<B>, usize, u32);

/// Of each request of a list: the index of its operation in the batch, and the scratch
/// word an atomic's old value lands in.
type Meta = (usize, Option<Word>);

/// A server's requests in a batch, in order, kept as the lists they are posted as: each
/// request once, in the vectors the post takes (no copy between the check and the post).
struct Group<B> {
    node: Arc<super::Node>,
    wrs: Vec<Wr<B>>,
    meta: Vec<Meta>,
}

impl<'c, B: RegisteredMemory + Send + 'static> PoolBatch<'c, B> {
    pub(super) fn new(client: &'c PoolClient) -> Self {
        Self {
            client,
            ops: Vec::new(),
        }
    }

    /// Adds a WRITE of `len` bytes of `local` (from `local_offset`) at `offset` of `ptr`.
    pub fn write(
        &mut self,
        ptr: RemotePtr,
        offset: u64,
        local: B,
        local_offset: usize,
        len: u32,
    ) -> &mut Self {
        self.ops.push(Op::Write {
            ptr,
            offset,
            local,
            local_offset,
            len,
        });
        self
    }

    /// Adds a READ of `len` bytes at `offset` of `ptr` into `local` (at `local_offset`).
    pub fn read(
        &mut self,
        ptr: RemotePtr,
        offset: u64,
        local: B,
        local_offset: usize,
        len: u32,
    ) -> &mut Self {
        self.ops.push(Op::Read {
            ptr,
            offset,
            local,
            local_offset,
            len,
        });
        self
    }

    /// Adds a compare-and-swap on the 8-byte word at `offset` of `ptr`.
    pub fn compare_and_swap(
        &mut self,
        ptr: RemotePtr,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> &mut Self {
        self.ops.push(Op::CompareAndSwap {
            ptr,
            offset,
            compare,
            swap,
        });
        self
    }

    /// Adds a fetch-and-add on the 8-byte word at `offset` of `ptr`.
    pub fn fetch_and_add(&mut self, ptr: RemotePtr, offset: u64, add: u64) -> &mut Self {
        self.ops.push(Op::FetchAndAdd { ptr, offset, add });
        self
    }

    /// Operations added so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Runs every operation; one outcome per operation, in the order they were added.
    ///
    /// Operations on one server are posted in that order as lists of up to its send-queue
    /// depth, each with one doorbell and one completion; RC executes a list in order, so a
    /// WRITE then a READ of the same bytes reads what was written. Lists on different
    /// servers run at the same time, with no order between them.
    ///
    /// # Errors
    /// Per operation. Checked before anything is posted, as for the single operations
    /// ([`PoolClient::write`]): [`Error::OutOfBounds`], [`Error::StalePointer`],
    /// [`Error::NotAllocated`], [`Error::NodeDown`], and a local range outside its buffer
    /// ([`CoreError::OutOfRange`](crate::CoreError::OutOfRange)); such an operation is not
    /// posted and the others go on. An atomic that finds no free scratch word (more than 4096 in flight in
    /// this client) gets [`CoreError::OutOfLimits`](crate::CoreError::OutOfLimits). When a
    /// posted list fails (an error completion, a dead connection: [`Error::NodeDown`], or
    /// the 5 s deadline), every operation of that list gets the error (the same variant and
    /// fields): RC stops a queue at its first error, so the ones before it took effect and
    /// the ones after did not, and which is which is not reported; treat their outcome as
    /// unknown, as for a single failed WRITE.
    pub async fn run(self) -> Vec<BatchOutcome<B>> {
        let shared = &self.client.shared;
        let mut out: Vec<BatchOutcome<B>> = Vec::with_capacity(self.ops.len());
        // Per node (in order of first use): the node and its requests, in order.
        let ops_len = self.ops.len();
        let mut groups: Vec<Group<B>> = Vec::new();
        // Nodes a full check reached in this batch (up, and known to this client): later
        // operations there take the quick check. Whether a node is still up is checked
        // again when its lists are posted.
        let mut known: Vec<Arc<super::Node>> = Vec::new();
        // The pointer of the last operation, if its checks passed.
        let mut passed: Option<RemotePtr> = None;
        for (index, op) in self.ops.into_iter().enumerate() {
            let (ptr, offset, len) = match &op {
                Op::Write {
                    ptr, offset, len, ..
                }
                | Op::Read {
                    ptr, offset, len, ..
                } => (*ptr, *offset, u64::from(*len)),
                Op::CompareAndSwap { ptr, offset, .. } | Op::FetchAndAdd { ptr, offset, .. } => {
                    (*ptr, *offset, 8)
                }
            };
            let found = match known.iter().find(|n| n.desc.node == ptr.node) {
                // The pointer the operation before this one named, and passed: only its
                // bounds and key are left to check.
                Some(node) if passed == Some(ptr) => shared
                    .reach_now(node, ptr, offset, len)
                    .map(|r| r.map(|a| (node.clone(), a))),
                Some(node) => shared
                    .target_now(node, ptr, offset, len)
                    .map(|r| r.map(|a| (node.clone(), a))),
                None => None,
            };
            let target = match found {
                Some(t) => t,
                None => {
                    let t = shared.target(ptr, offset, len).await;
                    if let Ok((node, _)) = &t {
                        if !known.iter().any(|n| n.desc.node == node.desc.node) {
                            known.push(node.clone());
                        }
                    }
                    t
                }
            };
            passed = target.is_ok().then_some(ptr);
            let posted = match target {
                Ok((node, remote)) => {
                    prepare(shared, index, op_into(op, remote)).map(|p| (node, p))
                }
                Err(e) => Err((e, op.into_buffer())),
            };
            match posted {
                Ok((node, p)) => {
                    out.push(BatchOutcome {
                        result: Ok(None),
                        buffer: None,
                    });
                    let at = match groups
                        .iter()
                        .position(|g| g.node.desc.node == node.desc.node)
                    {
                        Some(at) => at,
                        None => {
                            // Room for every operation left: no list grows by copying.
                            let room = ops_len - index;
                            groups.push(Group {
                                node,
                                wrs: Vec::with_capacity(room),
                                meta: Vec::with_capacity(room),
                            });
                            groups.len() - 1
                        }
                    };
                    let g = &mut groups[at];
                    g.wrs.push((p.op, p.local, p.local_offset, p.len));
                    g.meta.push((p.index, p.word));
                }
                Err((e, buffer)) => out.push(BatchOutcome {
                    result: Err(e),
                    buffer,
                }),
            }
        }
        // Every server's lists, at the same time.
        let mut lists = Vec::new();
        for Group {
            node,
            mut wrs,
            mut meta,
        } in groups
        {
            let depth = node.qp.qp().capacity().send.max(1) as usize;
            while wrs.len() > depth {
                let (more_wrs, more_meta) = (wrs.split_off(depth), meta.split_off(depth));
                lists.push(run_list(self.client, node.clone(), wrs, meta));
                (wrs, meta) = (more_wrs, more_meta);
            }
            lists.push(run_list(self.client, node, wrs, meta));
        }
        for ended in futures_util::future::join_all(lists).await {
            ended.record(shared, &mut out);
        }
        out
    }
}

impl<B> Op<B> {
    /// Its caller buffer, if it has one (given back when it is refused).
    fn into_buffer(self) -> Option<B> {
        match self {
            Op::Write { local, .. } | Op::Read { local, .. } => Some(local),
            Op::CompareAndSwap { .. } | Op::FetchAndAdd { .. } => None,
        }
    }
}

/// The op as a work request at `remote`, and its caller buffer if it has one.
fn op_into<B>(op: Op<B>, remote: RemoteAddr) -> (WrOp, Option<(B, usize, u32)>) {
    match op {
        Op::Write {
            local,
            local_offset,
            len,
            ..
        } => (
            WrOp::Write { remote, imm: None },
            Some((local, local_offset, len)),
        ),
        Op::Read {
            local,
            local_offset,
            len,
            ..
        } => (WrOp::Read { remote }, Some((local, local_offset, len))),
        Op::CompareAndSwap { compare, swap, .. } => (
            WrOp::CompareSwap {
                remote,
                compare,
                swap,
            },
            None,
        ),
        Op::FetchAndAdd { add, .. } => (WrOp::FetchAdd { remote, add }, None),
    }
}

/// A request ready to post, its local range checked (a bad one fails this operation only,
/// not the list it would have been in); an atomic takes a scratch word for its old value.
fn prepare<B: RegisteredMemory>(
    shared: &super::Shared,
    index: usize,
    (op, caller): (WrOp, Option<(B, usize, u32)>),
) -> std::result::Result<Posted<B>, (Error, Option<B>)> {
    match caller {
        Some((local, local_offset, len)) => match local.sge(local_offset, len) {
            Err(e) => Err((e.into(), Some(local))),
            Ok(_) => Ok(Posted {
                index,
                op,
                local: Local::Caller(local),
                local_offset,
                len,
                word: None,
            }),
        },
        None => {
            let word = shared.word().map_err(|e| (e, None))?;
            let view = Mr::share_range(&shared.scratch.mr, word.offset, 8)
                .map_err(|e| (e.into(), None))?;
            Ok(Posted {
                index,
                op,
                local: Local::Word(view),
                local_offset: 0,
                len: 8,
                word: Some(word),
            })
        }
    }
}

/// A list that ended: its server, how, and each request's index and scratch word and
/// local side, for [`Ended::record`].
struct Ended<B> {
    node: Arc<super::Node>,
    r: Result<OpCompletion>,
    meta: Vec<Meta>,
    locals: Vec<Local<B>>,
}

/// Posts `wrs` on `node` as one list with one doorbell and awaits its one completion.
async fn run_list<B: RegisteredMemory + Send + 'static>(
    client: &PoolClient,
    node: Arc<super::Node>,
    wrs: Vec<Wr<B>>,
    meta: Vec<Meta>,
) -> Ended<B> {
    let shared = &client.shared;
    let (r, locals) = match node.check_up() {
        Err(e) => (
            Err(e),
            wrs.into_iter().map(|(_, local, _, _)| local).collect(),
        ),
        Ok(()) => timed(&shared.timers, &node, node.qp.batch(wrs)).await,
    };
    Ended {
        node,
        r,
        meta,
        locals,
    }
}

impl<B> Ended<B> {
    /// Each request's outcome (its result, its caller buffer), in its place in `out`.
    fn record(self, shared: &super::Shared, out: &mut [BatchOutcome<B>]) {
        let r = shared.seen(&self.node, self.r.map(|_| ()));
        for ((index, word), local) in self.meta.into_iter().zip(self.locals) {
            let buffer = match local {
                Local::Caller(b) => Some(b),
                Local::Word(_) => None,
            };
            let result = match (&r, word) {
                (Err(e), _) => Err(same_error(e)),
                (Ok(()), None) => Ok(None),
                (Ok(()), Some(w)) => shared
                    .scratch
                    .mr
                    .read_u64(w.offset)
                    .map(Some)
                    .map_err(Error::from),
            };
            out[index] = BatchOutcome { result, buffer };
        }
    }
}

/// The error of a failed list (or step), for each of its operations (or machines).
pub(super) fn same_error(e: &Error) -> Error {
    match e {
        Error::NodeDown { node, reason } => Error::NodeDown {
            node: *node,
            reason: reason.clone(),
        },
        Error::Completion { status, opcode } => Error::Completion {
            status: *status,
            opcode: *opcode,
        },
        Error::TimedOut(what) => Error::TimedOut(what.clone()),
        Error::DeviceBroken(what) => Error::DeviceBroken(what.clone()),
        Error::Cancelled => Error::Cancelled,
        other => Error::ListFailed(other.to_string()),
    }
}
