//! The one-sided primitives every path uses (CAS, FAA, 8-byte READ), each with a deadline
//! after which its node is declared down, and the lookups of nodes and pointers.

use super::chunks::{Checked, Object};
use super::{Books, Node, Shared, Word, SCRATCH_WORDS};
use crate::fabric::Mr;
use crate::fabric::RemoteAddr;
use crate::remote::layout::{self, ChunkShape};
use crate::remote::placement::NodeLoad;
use crate::remote::RemotePtr;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one operation may stay outstanding before its node is declared down. (Some
/// devices never complete a request to a peer that vanished: rxe on Linux 6.1 does not.)
pub(super) const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Awaits an operation on `node`; past [`OP_TIMEOUT`] the node is marked down and its QP
/// moved to ERR, which flushes the operation (so its buffer still comes back). The clock
/// starts when the operation is first found pending (one that completes at once, as the
/// intra-host path does, never reads it).
pub(super) async fn timed<B>(
    timers: &Timers,
    node: &Node,
    op: impl Future<Output = (Result<crate::cq::OpCompletion>, B)>,
) -> (Result<crate::cq::OpCompletion>, B) {
    Timed {
        op: std::pin::pin!(op),
        node,
        timers,
        deadline: None,
        fired: false,
        timer: None,
    }
    .await
}

/// Deadlines of operations whose tasks wait to be woken (the lease thread wakes those past
/// theirs). An operation is listed only while it is pending, and only when the client is
/// not caller-driven (a caller polls again by itself).
pub(super) struct Timers {
    pub(super) caller_driven: bool,
    next: std::sync::atomic::AtomicU64,
    pub(super) pending: Mutex<std::collections::HashMap<u64, (Instant, std::task::Waker)>>,
}

impl Timers {
    pub(super) fn new(caller_driven: bool) -> Self {
        Self {
            caller_driven,
            next: std::sync::atomic::AtomicU64::new(0),
            pending: Mutex::new(std::collections::HashMap::new()),
        }
    }
}

struct Timed<'a, F> {
    op: std::pin::Pin<&'a mut F>,
    node: &'a Node,
    timers: &'a Timers,
    /// Set when the operation is first found pending.
    deadline: Option<Instant>,
    fired: bool,
    /// Its entry in `timers`, while it has one.
    timer: Option<u64>,
}

impl<F> Timed<'_, F> {
    fn unlist(&mut self) {
        if let Some(id) = self.timer.take() {
            self.timers.pending.lock().remove(&id);
        }
    }
}

impl<F> Drop for Timed<'_, F> {
    fn drop(&mut self) {
        self.unlist();
    }
}

impl<F: Future> Future for Timed<'_, F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        if let std::task::Poll::Ready(v) = self.op.as_mut().poll(cx) {
            self.unlist();
            return std::task::Poll::Ready(v);
        }
        if !self.fired {
            let now = Instant::now();
            let deadline = *self.deadline.get_or_insert(now + OP_TIMEOUT);
            if now >= deadline {
                self.fired = true;
                self.unlist();
                let (free, depth, in_flight) = self.node.qp.queue_state();
                self.node.mark_down(format!(
                    "an operation got no completion within {OP_TIMEOUT:?} (its send queue \
                     {free} of {depth} entries free, {in_flight} operations in flight on the \
                     client's engine)"
                ));
                self.node.qp.qp().modify_to_error();
                cx.waker().wake_by_ref();
            } else if self.timer.is_none() && !self.timers.caller_driven {
                let id = self.timers.next.fetch_add(1, Ordering::Relaxed);
                let entry = (deadline, cx.waker().clone());
                self.timers.pending.lock().insert(id, entry);
                self.timer = Some(id);
            }
        }
        std::task::Poll::Pending
    }
}

/// Resolves at `deadline`: a caller-driven client polls it again by itself; otherwise the
/// lease thread wakes it (late by up to its own period, a few milliseconds to a quarter
/// lease: meant for waits of that order or longer).
pub(super) struct Sleep<'a> {
    pub(super) timers: &'a Timers,
    pub(super) deadline: Instant,
    pub(super) timer: Option<u64>,
}

impl Drop for Sleep<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.timer.take() {
            self.timers.pending.lock().remove(&id);
        }
    }
}

impl Future for Sleep<'_> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if Instant::now() >= self.deadline {
            if let Some(id) = self.timer.take() {
                self.timers.pending.lock().remove(&id);
            }
            return std::task::Poll::Ready(());
        }
        if self.timers.caller_driven {
            // The caller's loop polls again; asking to be polled keeps a runtime's task
            // going too.
            cx.waker().wake_by_ref();
        } else {
            let id = match self.timer {
                Some(id) => id,
                None => {
                    let id = self.timers.next.fetch_add(1, Ordering::Relaxed);
                    self.timer = Some(id);
                    id
                }
            };
            let entry = (self.deadline, cx.waker().clone());
            self.timers.pending.lock().insert(id, entry);
        }
        std::task::Poll::Pending
    }
}

impl Shared {
    /// A registered buffer of at least `len` bytes: from the client's staging pool (made on
    /// first use; every class up to 2 MiB), or registered now when the pool has none free or
    /// `len` is larger.
    pub(super) fn staging(&self, len: usize) -> Result<Mr<crate::fabric::Shared>> {
        if let Ok(buf) = self.pooled(len) {
            return Ok(buf);
        }
        Ok(self
            .pd
            .alloc_mr(len.max(8), crate::fabric::AccessFlags::LOCAL_WRITE)?
            .into_shared())
    }

    /// A buffer of `len` bytes from the client's staging pool (made on first use).
    pub(super) fn pooled(&self, len: usize) -> Result<Mr<crate::fabric::Shared>> {
        let pool = match self.staging_buffers.get() {
            Some(p) => Some(p),
            None => crate::buf::BufferPool::new(self.pd.clone(), crate::buf::PoolConfig::default())
                .ok()
                .map(|p| self.staging_buffers.get_or_init(|| p)),
        };
        match pool.map(|p| p.alloc(len)) {
            Some(buf) => Ok(buf?.into_shared()),
            None => Err(Error::Core(crate::CoreError::BadSetting {
                name: "staging buffer pool".into(),
                value: "none".into(),
                reason: "the pool could not be made".into(),
            })),
        }
    }

    pub(super) fn word(&self) -> Result<Word> {
        let offset = self.scratch.free.lock().pop().ok_or_else(|| {
            Error::Core(crate::CoreError::OutOfLimits {
                what: "remote atomics in flight at once",
                value: SCRATCH_WORDS as u64 + 1,
                min: 1,
                max: SCRATCH_WORDS as u64,
            })
        })?;
        Ok(Word {
            scratch: self.scratch.clone(),
            offset,
        })
    }

    /// Turns a failed operation on `node` into `NodeDown` when the connection is gone.
    pub(super) fn seen<T>(&self, node: &Node, r: Result<T>) -> Result<T> {
        match r {
            Err(Error::Completion { status, .. })
                if matches!(
                    status,
                    crate::fabric::WcStatus::RetryExcErr | crate::fabric::WcStatus::WrFlushErr
                ) =>
            {
                let reason = format!("operation failed with {status}");
                node.mark_down(reason.clone());
                Err(Error::NodeDown {
                    node: node.desc.node,
                    reason,
                })
            }
            other => other,
        }
    }

    pub(super) async fn cas(
        &self,
        node: &Node,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        node.check_up()?;
        let w = self.word()?;
        let buf = Mr::share(&self.scratch.mr);
        let op = node
            .qp
            .compare_and_swap(buf, w.offset, remote, compare, swap);
        let (r, _) = timed(&self.timers, node, op).await;
        self.seen(node, r)?;
        Ok(self.scratch.mr.read_u64(w.offset)?)
    }

    pub(super) async fn faa(&self, node: &Node, remote: RemoteAddr, add: u64) -> Result<u64> {
        node.check_up()?;
        let w = self.word()?;
        let buf = Mr::share(&self.scratch.mr);
        let (r, _) = timed(
            &self.timers,
            node,
            node.qp.fetch_and_add(buf, w.offset, remote, add),
        )
        .await;
        self.seen(node, r)?;
        Ok(self.scratch.mr.read_u64(w.offset)?)
    }

    pub(super) async fn read_u64(&self, node: &Node, offset: u64) -> Result<u64> {
        node.check_up()?;
        let w = self.word()?;
        let buf = Mr::share(&self.scratch.mr);
        let remote = self.at(node, offset, 8, false).await?;
        let (r, _) = timed(&self.timers, node, node.qp.read(buf, w.offset, 8, remote)).await;
        self.seen(node, r)?;
        Ok(self.scratch.mr.read_u64(w.offset)?)
    }

    pub(super) async fn read_bitmap(
        &self,
        node: &Node,
        index: u64,
        shape: ChunkShape,
    ) -> Result<Vec<u64>> {
        let words = shape.object_count.div_ceil(64) as usize;
        let base = node.desc.layout.chunk(index) + layout::chunk::BITMAP;
        // One READ of the whole bitmap (up to a few KiB).
        self.read_words(node, base, words).await
    }

    /// `words` 8-byte words at `offset` of the node's region, in one READ into a buffer of
    /// its own.
    pub(super) async fn read_words(
        &self,
        node: &Node,
        base: u64,
        words: usize,
    ) -> Result<Vec<u64>> {
        node.check_up()?;
        // A region of its own, not the staging pool (see `alloc.rs`, `Io::Write`).
        let mr = Arc::new(
            self.pd
                .alloc_mr(words * 8, crate::fabric::AccessFlags::LOCAL_WRITE)?,
        );
        let local = Mr::share(&mr);
        let remote = self.at(node, base, words as u64 * 8, false).await?;
        let op = node.qp.read(local, 0, (words * 8) as u32, remote);
        let (r, _) = timed(&self.timers, node, op).await;
        self.seen(node, r)?;
        Ok((0..words)
            .map(|w| mr.read_u64(w * 8))
            .collect::<rdmapool_core::Result<_>>()?)
    }

    pub(super) fn live_nodes(&self) -> Vec<Arc<Node>> {
        let mut v: Vec<_> = self
            .nodes
            .lock()
            .values()
            .filter(|n| n.down.lock().is_none())
            .cloned()
            .collect();
        v.sort_by_key(|n| n.desc.node);
        v
    }

    pub(super) fn loads(&self) -> Vec<NodeLoad> {
        self.live_nodes()
            .iter()
            .map(|n| NodeLoad {
                node: n.desc.node,
                capacity: n.desc.layout.chunk_count * n.desc.layout.chunk_size,
                used: n.book.lock().used(),
                draining: n.draining.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// The node of `ptr`, if `ptr` names the incarnation this client knows it by (checked
    /// before any byte moves: a restarted server's new memory is never reached through a
    /// pointer into its predecessor's).
    pub(super) fn node_of(&self, ptr: RemotePtr) -> Result<Arc<Node>> {
        let node = self
            .nodes
            .lock()
            .get(&ptr.node)
            .cloned()
            .ok_or_else(|| Error::NodeDown {
                node: ptr.node,
                reason: "not a member: no server of this pool known to this client has that id"
                    .into(),
            })?;
        node.book.lock().check_incarnation(ptr)?;
        node.check_up()?;
        Ok(node)
    }

    /// The node and remote address of `len` bytes at `offset` of `ptr`, bounds checked
    /// against `ptr.len` and `ptr` against the object it names (its chunk's size class:
    /// free for this client's own chunks and cached for others; a READ of the chunk header
    /// when not cached).
    pub(super) async fn target(
        &self,
        ptr: RemotePtr,
        offset: u64,
        len: u64,
    ) -> Result<(Arc<Node>, RemoteAddr)> {
        check_bounds(ptr, offset, len)?;
        let node = self.node_of(ptr)?;
        match self.target_now(&node, ptr, offset, len) {
            Some(known) => known.map(|remote| (node, remote)),
            // Boxed: the header READs' futures are large and rarely needed, and every
            // operation's future would carry (and move) them.
            None => Box::pin(self.target_reading(node, ptr, offset, len)).await,
        }
    }

    /// [`Shared::target`] on `node` without I/O: `None` when that needs a chunk header read
    /// or a window asked for, or `ptr` names another node.
    pub(super) fn target_now(
        &self,
        node: &Node,
        ptr: RemotePtr,
        offset: u64,
        len: u64,
    ) -> Option<Result<RemoteAddr>> {
        if let Err(e) = check_bounds(ptr, offset, len) {
            return Some(Err(e));
        }
        if ptr.node != node.desc.node {
            return None;
        }
        let checked = node.book.lock().check(ptr, false);
        match checked {
            Err(e) => Some(Err(e)),
            Ok(Checked::Known(_)) => self.reach_now(node, ptr, offset, len),
            Ok(Checked::ReadHeader { .. }) => None,
        }
    }

    /// [`Shared::target_now`] of a `ptr` on `node` whose object was checked a moment ago
    /// (an earlier operation of the same batch): bounds and the key that reaches it only.
    pub(super) fn reach_now(
        &self,
        node: &Node,
        ptr: RemotePtr,
        offset: u64,
        len: u64,
    ) -> Option<Result<RemoteAddr>> {
        if let Err(e) = check_bounds(ptr, offset, len) {
            return Some(Err(e));
        }
        self.at_now(node, ptr.offset + offset, len.max(1), true)
    }

    /// [`Shared::target`] when the chunk header is to be read or the window asked for.
    async fn target_reading(
        &self,
        node: Arc<Node>,
        ptr: RemotePtr,
        offset: u64,
        len: u64,
    ) -> Result<(Arc<Node>, RemoteAddr)> {
        self.check_object(&node, Books::Pool, ptr, false).await?;
        let remote = self
            .at(&node, ptr.offset + offset, len.max(1), true)
            .await?;
        Ok((node, remote))
    }

    /// Checks `ptr` against the object it names in book `which` ([`Book::check`]): free
    /// for this client's own chunks and those whose size class is cached, two 8-byte READs
    /// of the chunk header at once (one round trip) otherwise. With `fresh`, a chunk that
    /// is not this client's is always read.
    pub(super) async fn check_object(
        &self,
        node: &Node,
        which: Books,
        ptr: RemotePtr,
        fresh: bool,
    ) -> Result<Object> {
        let (book, _) = node.book_of(which);
        let chunk = match book.lock().check(ptr, fresh)? {
            Checked::Known(object) => return Ok(object),
            Checked::ReadHeader { chunk } => chunk,
        };
        // The magic and the object size at once: one round trip, two scratch words.
        let at = node.desc.layout.chunk(chunk);
        let (magic, size) = futures_util::future::join(
            self.read_u64(node, at + layout::chunk::MAGIC),
            self.read_u64(node, at + layout::chunk::OBJECT_SIZE),
        )
        .await;
        book.lock().on_header(ptr, chunk, magic?, size?)
    }
}

/// `len` bytes at `offset` fit in the allocation `ptr` names.
fn check_bounds(ptr: RemotePtr, offset: u64, len: u64) -> Result<()> {
    if offset.checked_add(len).is_none_or(|end| end > ptr.len) {
        return Err(Error::OutOfBounds {
            offset,
            len,
            limit: ptr.len,
        });
    }
    Ok(())
}
