//! A client of a node that isolates its clients (`remote::isolation`): which window's key
//! reaches an offset, and the control requests (setup, claim, release, access) that go
//! through the server. Accesses no window grants are refused here, before anything is
//! posted (a wrong key would end the connection).

use super::ops::timed;
use super::{Node, Shared};
use crate::fabric::{AccessFlags, Mr, RemoteAddr};
use crate::remote::isolation::{Control, CONTROL_LEN, NO_SLOT, QUOTA_REACHED, REFUSED};
use crate::remote::layout::{self, DURABLE_TAG};
use crate::{Error, Result};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;

/// The windows a node granted this client, and its control channel.
pub(super) struct Windows {
    /// Key of the read-only window over the header, slots and chunk table.
    meta_rkey: AtomicU32,
    /// Offset of this client's slot, and the key of its window.
    slot: AtomicU64,
    slot_rkey: AtomicU32,
    /// Keys of the windows over this client's chunks.
    chunks: Mutex<FxHashMap<u64, u32>>,
    /// One control request at a time; the last request id.
    control: tokio::sync::Mutex<u32>,
    /// The request at 0, the answer at `CONTROL_LEN`.
    buf: Arc<Mr>,
}

/// What the server granted at setup.
pub(super) struct Grant {
    /// Offset of the slot.
    pub(super) slot: u64,
    /// The heartbeat the server gave a slot it claimed now; 0 if the id held it already.
    pub(super) beat: u64,
}

impl Windows {
    pub(super) fn new(pd: &crate::fabric::Pd) -> Result<Self> {
        Ok(Self {
            meta_rkey: AtomicU32::new(0),
            slot: AtomicU64::new(u64::MAX),
            slot_rkey: AtomicU32::new(0),
            chunks: Mutex::new(FxHashMap::default()),
            control: tokio::sync::Mutex::new(0),
            buf: Arc::new(pd.alloc_mr(2 * CONTROL_LEN, AccessFlags::LOCAL_WRITE)?),
        })
    }
}

/// What reaches an access on an isolated node ([`Shared::window_of`]).
enum Reach {
    /// A window whose key is known.
    Key(u32),
    /// The window over this chunk (known once asked for).
    Chunk(u64),
}

fn refused(node: &Node, offset: u64, reason: impl Into<String>) -> Error {
    Error::Isolated {
        node: node.desc.node,
        offset,
        reason: reason.into(),
    }
}

impl Shared {
    /// Where `offset` of `node`'s region is, under the key that reaches it: the region's own
    /// on a trusted node; on an isolated one the window's, asking the server for the window
    /// over an owned chunk the first time. The operation covers `len` bytes; `write`: it
    /// writes (or is atomic).
    pub(super) async fn at(
        &self,
        node: &Node,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<RemoteAddr> {
        match self.at_now(node, offset, len, write) {
            Some(known) => known,
            // Boxed: the control request's future is large and rarely needed, and every
            // future that awaits this one would carry (and move) it.
            None => Box::pin(self.at_asking(node, offset, len, write)).await,
        }
    }

    /// [`Shared::at`] without I/O: `None` when the window over the chunk must be asked for.
    pub(super) fn at_now(
        &self,
        node: &Node,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Option<Result<RemoteAddr>> {
        let Some(w) = &node.windows else {
            return Some(Ok(node.remote(offset)));
        };
        let rkey = match self.window_of(node, w, offset, len, write) {
            Ok(Reach::Key(rkey)) => rkey,
            Ok(Reach::Chunk(chunk)) => *w.chunks.lock().get(&chunk)?,
            Err(e) => return Some(Err(e)),
        };
        Some(Ok(RemoteAddr {
            addr: node.desc.region.addr + offset,
            rkey,
        }))
    }

    /// [`Shared::at`] on an isolated node when the chunk's window may have to be asked for.
    async fn at_asking(
        &self,
        node: &Node,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<RemoteAddr> {
        let Some(w) = &node.windows else {
            return Ok(node.remote(offset));
        };
        let rkey = match self.window_of(node, w, offset, len, write)? {
            Reach::Key(rkey) => rkey,
            Reach::Chunk(chunk) => self.chunk_rkey(node, w, chunk).await?,
        };
        Ok(RemoteAddr {
            addr: node.desc.region.addr + offset,
            rkey,
        })
    }

    /// Which window reaches `len` bytes at `offset` on an isolated node: one whose key is
    /// known, or the window over a chunk; refused when none may.
    fn window_of(
        &self,
        node: &Node,
        w: &Windows,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<Reach> {
        let l = node.desc.layout;
        let slot = w.slot.load(Ordering::Acquire);
        let end = offset.saturating_add(len);
        let beat = slot.saturating_add(layout::slot::HEARTBEAT);
        if write && offset >= beat && end <= beat + 8 {
            // The slot window covers the heartbeat word only (the owner word is the
            // server's; reads of the slot go through the metadata window).
            Ok(Reach::Key(w.slot_rkey.load(Ordering::Acquire)))
        } else if end <= l.data_offset {
            if write {
                return Err(refused(
                    node,
                    offset,
                    "the header, the lease slots (but for its own heartbeat) and the chunk table are read-only",
                ));
            }
            Ok(Reach::Key(w.meta_rkey.load(Ordering::Acquire)))
        } else if let Some(chunk) = l
            .chunk_of(offset)
            .filter(|&c| end <= l.chunk(c) + l.chunk_size)
        {
            Ok(Reach::Chunk(chunk))
        } else {
            Err(refused(
                node,
                offset,
                "the access spans windows, or lies past the last chunk",
            ))
        }
    }

    /// The key of the window over `chunk`: known, or asked for (the server grants it only
    /// if the table says this client owns the chunk).
    async fn chunk_rkey(&self, node: &Node, w: &Windows, chunk: u64) -> Result<u32> {
        if let Some(&k) = w.chunks.lock().get(&chunk) {
            return Ok(k);
        }
        match self
            .control(node, w, |req| Control::Access { req, chunk })
            .await?
        {
            Control::Answer { old, rkey, .. }
                if (old == self.id || old == DURABLE_TAG | self.id) && rkey != 0 =>
            {
                w.chunks.lock().insert(chunk, rkey);
                Ok(rkey)
            }
            Control::Answer { old, .. } => Err(refused(
                node,
                node.desc.layout.chunk(chunk),
                match old {
                    0 => "a free chunk".to_string(),
                    REFUSED => "refused by the server".to_string(),
                    owner => format!("chunk {chunk} belongs to client {owner}"),
                },
            )),
            other => Err(self.odd_answer(node, other)),
        }
    }

    /// The compare-and-swap of chunk-table entry `chunk` a machine asked for, made by the
    /// server: a claim (0 to this id, or to `2^63 | id` for its store; the window comes with
    /// it) or a release (either back to 0; the window goes first). Its old value, as a CAS
    /// would answer.
    pub(super) async fn table_cas(
        &self,
        node: &Node,
        w: &Windows,
        chunk: u64,
        expected: u64,
        swap: u64,
    ) -> Result<u64> {
        let mine = |v: u64| v == self.id || v == DURABLE_TAG | self.id;
        let claim = expected == 0 && mine(swap);
        let release = mine(expected) && swap == 0;
        let answer = if claim && swap == self.id {
            self.control(node, w, |req| Control::Claim { req, chunk })
                .await?
        } else if claim {
            // A chunk of this tenant's store namespace (docs/STORE.md section 2).
            self.control(node, w, |req| Control::ClaimStore { req, chunk })
                .await?
        } else if release {
            w.chunks.lock().remove(&chunk);
            self.control(node, w, |req| Control::Release { req, chunk })
                .await?
        } else {
            return Err(refused(
                node,
                node.desc.layout.table_entry(chunk),
                "the chunk table changes only by claims and releases through the server",
            ));
        };
        match answer {
            // This id owns all the chunks the node allows one id: the node is full for it.
            Control::Answer {
                old: QUOTA_REACHED, ..
            } => Err(Error::RemoteExhausted {
                size: node.desc.layout.chunk_size,
            }),
            Control::Answer { old: REFUSED, .. } => Err(refused(
                node,
                node.desc.layout.table_entry(chunk),
                "the server refused the request",
            )),
            Control::Answer { old, rkey, .. } => {
                if claim && old == 0 {
                    w.chunks.lock().insert(chunk, rkey);
                }
                Ok(old)
            }
            other => Err(self.odd_answer(node, other)),
        }
    }

    /// Asks the node for this client's lease slot and windows (once, after connecting).
    pub(super) async fn setup(&self, node: &Node) -> Result<Grant> {
        let w = node.windows.as_ref().ok_or_else(|| {
            Error::Core(crate::CoreError::Malformed {
                what: "pool descriptor",
                reason: format!("node {} is not isolated", node.desc.node),
            })
        })?;
        match self.control(node, w, |req| Control::Setup { req }).await? {
            Control::Granted { slot: NO_SLOT, .. } => Err(Error::LeasesFull {
                node: node.desc.node,
                slots: node.desc.layout.client_count,
            }),
            Control::Granted {
                slot,
                meta_rkey,
                slot_rkey,
                beat,
                ..
            } if slot < node.desc.layout.client_count && meta_rkey != 0 && slot_rkey != 0 => {
                let at = node.desc.layout.client_slot(slot);
                w.meta_rkey.store(meta_rkey, Ordering::Release);
                w.slot_rkey.store(slot_rkey, Ordering::Release);
                w.slot.store(at, Ordering::Release);
                Ok(Grant { slot: at, beat })
            }
            other => Err(self.odd_answer(node, other)),
        }
    }

    fn odd_answer(&self, node: &Node, answer: Control) -> Error {
        Error::Core(crate::CoreError::Malformed {
            what: "pool control answer",
            reason: format!("node {}: {answer:?}", node.desc.node),
        })
    }

    /// One request and its answer, on the node's connection (one at a time per node, so
    /// answers come back in order; the request id is checked anyway).
    async fn control(
        &self,
        node: &Node,
        w: &Windows,
        request: impl FnOnce(u32) -> Control,
    ) -> Result<Control> {
        node.check_up()?;
        let mut last = w.control.lock().await;
        *last = last.wrapping_add(1);
        let req = *last;
        w.buf.write_at(0, &request(req).encode())?;
        let recv = node
            .qp
            .recv(Mr::share(&w.buf), CONTROL_LEN, CONTROL_LEN as u32);
        let mut recv = std::pin::pin!(timed(&self.timers, node, recv));
        // Posted at its first poll: before the request goes, so the answer finds it.
        let mut early = None;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = recv.as_mut().poll(cx) {
                early = Some(r);
            }
            Poll::Ready(())
        })
        .await;
        let send = node.qp.send(Mr::share(&w.buf), 0, CONTROL_LEN as u32);
        let (sent, _) = timed(&self.timers, node, send).await;
        self.seen(node, sent)?;
        let (got, _) = match early {
            Some(r) => r,
            None => recv.await,
        };
        self.seen(node, got)?;
        let mut answer = [0u8; CONTROL_LEN];
        w.buf.read_at(CONTROL_LEN, &mut answer)?;
        let answer = Control::decode(&answer)?;
        if answer.req() != req {
            return Err(Error::Core(crate::CoreError::Malformed {
                what: "pool control answer",
                reason: format!("answer to request {}, want {req}", answer.req()),
            }));
        }
        Ok(answer)
    }
}
