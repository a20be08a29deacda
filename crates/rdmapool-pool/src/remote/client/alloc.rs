//! Allocation and free: chunks claimed with CAS on the table, objects with CAS on the chunk
//! bitmaps, empty chunks given back. The decisions are the machines' of `chunks`; this
//! places an allocation on a node and performs the machines' operations.

use super::chunks::{Alloc, Answer, Book, Free, Io, Machine, Step};
use super::node::Books;
use super::ops::timed;
use super::{Node, Shared};
use crate::fabric::AccessFlags;
use crate::fabric::Mr;
use crate::remote::layout::{largest_object, size_class};
use crate::remote::RemotePtr;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Shared {
    pub(super) async fn alloc(&self, size: u64, key: Option<u64>) -> Result<RemotePtr> {
        if size == 0 {
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "bytes to allocate",
                value: 0,
                min: 1,
                max: u64::MAX,
            }));
        }
        let nodes = self.live_nodes();
        if nodes.is_empty() {
            return Err(Error::NoServer {
                reason: self.why_no_server(),
            });
        }
        let loads = self.loads();
        let order = self.placement.lock().order(&loads, key);
        // Whether a node was full, which was draining, and why the last one that failed is
        // down: a pool whose only nodes went down under this call is down, not exhausted.
        let (mut full, mut draining, mut down) = (false, None, None);
        for id in order {
            let Some(node) = nodes.iter().find(|n| n.desc.node == id) else {
                continue;
            };
            if node.draining.load(Ordering::Relaxed) {
                draining.get_or_insert(id);
                continue;
            }
            let chunk_size = node.desc.layout.chunk_size;
            let Some(class) = size_class(size, chunk_size) else {
                // The largest object is one per chunk, less the chunk's header.
                return Err(Error::Core(crate::CoreError::OutOfLimits {
                    what: "bytes to allocate (one object per chunk at most)",
                    value: size,
                    min: 1,
                    max: largest_object(chunk_size),
                }));
            };
            match self.alloc_on(node, class, size).await {
                Ok(Some(p)) => return Ok(p),
                // An isolated node whose quota of chunks for this id is used up is full too.
                Ok(None) | Err(Error::RemoteExhausted { .. }) => full = true,
                Err(e @ Error::NodeDown { .. }) => down = Some(e),
                Err(e) => return Err(e),
            }
        }
        // Placement may leave draining nodes out of its order: look at them all.
        let draining = draining.or_else(|| {
            nodes
                .iter()
                .find(|n| n.draining.load(Ordering::Relaxed))
                .map(|n| n.desc.node)
        });
        match (down, draining) {
            (_, _) if full => Err(Error::RemoteExhausted { size }),
            (Some(e), _) => Err(e),
            (None, Some(node)) => Err(Error::Draining { node }),
            (None, None) => Err(Error::RemoteExhausted { size }),
        }
    }

    /// Allocates an object of `class` on `node` for `size` bytes (the decisions are
    /// [`Alloc`]'s). `None`: the node has no room.
    pub(super) async fn alloc_on(
        &self,
        node: &Node,
        class: u64,
        size: u64,
    ) -> Result<Option<RemotePtr>> {
        let offset = self.drive(node, Alloc::new(class)).await?;
        Ok(offset.map(|offset| RemotePtr {
            node: node.desc.node,
            offset,
            len: size,
            incarnation: node.desc.incarnation,
        }))
    }

    /// Runs `machine` on `node`: performs each operation it asks for and feeds the answer
    /// back. When an operation fails, or this future is dropped before the machine is done,
    /// the machine gives back what it reserved in the book (`Machine::abandon`).
    pub(super) async fn drive<M: Machine<Context = Book>>(
        &self,
        node: &Node,
        machine: M,
    ) -> Result<M::Output> {
        self.drive_in(node, Books::Pool, machine).await
    }

    /// [`Shared::drive`] in the book `which` of `node`: the real driver of the pool's
    /// machines (`remote/step.rs`), which lends them the book for each call and wakes the
    /// tasks waiting for a claim when one ends.
    pub(super) async fn drive_in<M: Machine<Context = Book>>(
        &self,
        node: &Node,
        which: Books,
        machine: M,
    ) -> Result<M::Output> {
        let (book, notice) = node.book_of(which);
        let mut run = Running {
            node,
            which,
            machine,
            done: false,
        };
        // The answers to the last step: the pool's machines ask for one operation at a time
        // (kept without a heap allocation), a step of several goes in `many`.
        let mut one: Option<Answer> = None;
        let mut many: Vec<Answer> = Vec::new();
        // The clock is read before the first call and after each wait: the chunk machines
        // decide nothing by time, and a reading per operation would cost them more than
        // some of their operations do (Machine::advance).
        let mut now = std::time::Instant::now();
        loop {
            // Registered before the book is looked at: a claim released after that look
            // still wakes this task.
            let claimed = notice.notified();
            let mut claimed = std::pin::pin!(claimed);
            claimed.as_mut().enable();
            let next = {
                let mut book = book.lock();
                let answers = if many.is_empty() {
                    one.as_slice()
                } else {
                    &many[..]
                };
                let next = run.machine.advance(&mut book, now, answers);
                if book.take_released() {
                    notice.notify_waiters();
                }
                next?
            };
            one = None;
            many.clear();
            match next {
                Step::One(op) => one = Some(self.perform(node, op.io).await?),
                Step::Do(ops) => {
                    for op in ops {
                        many.push(self.perform(node, op.io).await?);
                    }
                }
                Step::Sleep(until) => {
                    super::ops::Sleep {
                        timers: &self.timers,
                        deadline: until,
                        timer: None,
                    }
                    .await;
                    now = std::time::Instant::now();
                }
                Step::Wait => {
                    claimed.await;
                    now = std::time::Instant::now();
                }
                Step::Done(out) => {
                    run.done = true;
                    return Ok(out);
                }
            }
        }
    }

    /// One operation a machine asked for, on `node`'s region.
    pub(super) async fn perform(&self, node: &Node, io: Io) -> Result<Answer> {
        match io {
            Io::Cas { at, expected, swap } => {
                let l = node.desc.layout;
                let entry = at
                    .checked_sub(l.table_offset)
                    .map(|rel| rel / crate::remote::layout::TABLE_ENTRY)
                    .filter(|&j| j < l.chunk_count && l.table_entry(j) == at);
                match (entry, &node.windows) {
                    // On an isolated node, claims and releases go through the server.
                    (Some(chunk), Some(w)) => self.table_cas(node, w, chunk, expected, swap).await,
                    _ => {
                        let remote = self.at(node, at, 8, true).await?;
                        self.cas(node, remote, expected, swap).await
                    }
                }
                .map(Answer::Word)
            }
            Io::Read { at, len } if len.is_multiple_of(8) => {
                let words = usize::try_from(len / 8).map_err(|_| Error::OutOfBounds {
                    offset: at,
                    len,
                    limit: node.desc.layout.len,
                })?;
                if words == 1 {
                    let word = self.read_u64(node, at).await?;
                    return Ok(Answer::Bytes(word.to_le_bytes().to_vec()));
                }
                let words = self.read_words(node, at, words).await?;
                Ok(Answer::Bytes(
                    words.iter().flat_map(|w| w.to_le_bytes()).collect(),
                ))
            }
            Io::Write { at, bytes } => {
                node.check_up()?;
                // A region of its own, not the staging pool: a plain pool client writes a
                // chunk header only when it claims a chunk, and must not pin the staging
                // pool's 4 MiB for that (a burst of clients joining would pin 4 MiB each).
                let staging = Arc::new(
                    self.pd
                        .alloc_mr(bytes.len().max(64), AccessFlags::LOCAL_WRITE)?,
                );
                staging.write_at(0, &bytes)?;
                let remote = self.at(node, at, bytes.len() as u64, true).await?;
                let op = node
                    .qp
                    .write(Mr::share(&staging), 0, bytes.len() as u32, remote);
                let (r, _) = timed(&self.timers, node, op).await;
                self.seen(node, r)?;
                Ok(Answer::Written)
            }
            // The store's, performed alone (`Regions::io`): a cache's usage word.
            Io::FetchAdd { at, add } => {
                let remote = self.at(node, at, 8, true).await?;
                self.faa(node, remote, add).await.map(Answer::Word)
            }
            // The pool's machines read whole words and never write a payload or allocate
            // a block of their own; the store's run through `Regions::perform`.
            io @ (Io::Read { .. }
            | Io::ReadInto { .. }
            | Io::WriteWithPayload { .. }
            | Io::Alloc { .. }) => Err(Error::Core(crate::CoreError::Malformed {
                what: "operation of a pool machine",
                reason: format!("{io:?} is not one a node's book driver performs"),
            })),
        }
    }

    /// Whether `ptr` is a live allocation now: its chunk is initialised (a chunk the server
    /// took back from an expired lease is not) and its object's bit is set. One-sided, and
    /// only a snapshot: another client may free it, or allocate it again, right after.
    pub(super) async fn check_live(&self, ptr: RemotePtr) -> Result<()> {
        let node = self.node_of(ptr)?;
        let object = self.check_object(&node, Books::Pool, ptr, true).await?;
        let (at, bit) = object.bit(&node.desc.layout);
        if self.read_u64(&node, at).await? & bit == 0 {
            return Err(Error::NotAllocated(format!(
                "{ptr:?}: not allocated (freed, or its chunk was taken back when the lease of \
                 the client that allocated it ran out)"
            )));
        }
        Ok(())
    }

    /// Frees the object `ptr` names (the decisions are [`Free`]'s).
    pub(super) async fn free(&self, ptr: RemotePtr) -> Result<()> {
        let node = self.node_of(ptr)?;
        let object = self.check_object(&node, Books::Pool, ptr, true).await?;
        self.drive(&node, Free::new(ptr, object)).await.map(drop)
    }
}

/// A machine being driven; told to give back what it reserved unless it finished.
struct Running<'a, M: Machine<Context = Book>> {
    node: &'a Node,
    which: Books,
    machine: M,
    done: bool,
}

impl<M: Machine<Context = Book>> Drop for Running<'_, M> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (book, notice) = self.node.book_of(self.which);
        let mut book = book.lock();
        self.machine.abandon(&mut book);
        if book.take_released() {
            notice.notify_waiters();
        }
    }
}
