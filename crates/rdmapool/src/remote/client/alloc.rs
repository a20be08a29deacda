//! Allocation and free: chunks claimed with CAS on the table, objects with CAS on the chunk
//! bitmaps, empty chunks given back.

use super::ops::{hash64, timed};
use super::{ChunkView, Node, Shared};
use crate::cq::LocalBuf;
use crate::fabric::AccessFlags;
use crate::remote::layout::{self, largest_object, size_class, ChunkShape};
use crate::remote::RemotePtr;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Shared {
    pub(super) async fn alloc(&self, size: u64, key: Option<u64>) -> Result<RemotePtr> {
        if size == 0 {
            return Err(Error::InvalidArgument(
                "an allocation of 0 bytes: the smallest is 1 byte".into(),
            ));
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
                return Err(Error::InvalidArgument(format!(
                    "an allocation of {size} bytes: the largest object is {} bytes (one per \
                     {chunk_size}-byte chunk, less its header)",
                    largest_object(chunk_size)
                )));
            };
            match self.alloc_on(node, class, size).await {
                Ok(Some(p)) => return Ok(p),
                Ok(None) => full = true,
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

    /// Allocates in a chunk of `class` on `node`, claiming a new chunk when those it has are
    /// full. `None`: the node has no room.
    pub(super) async fn alloc_on(
        &self,
        node: &Node,
        class: u64,
        size: u64,
    ) -> Result<Option<RemotePtr>> {
        loop {
            if let Some(p) = self.alloc_in_owned(node, class, size).await? {
                return Ok(Some(p));
            }
            let _one = node.claiming.lock().await;
            // Another task of ours may have claimed one meanwhile.
            if node
                .chunks
                .lock()
                .iter()
                .any(|c| c.shape.object_size == class && c.free_bit().is_some())
            {
                continue;
            }
            // Before claiming another chunk, look again at the full ones: other clients may
            // have freed objects in them (only clears happen behind our back).
            if self.refresh_full(node, class).await? {
                continue;
            }
            if !self.claim_chunk(node, class).await? {
                return Ok(None);
            }
        }
    }

    /// Re-reads the bitmaps of this class's owned chunks; true if one has room again.
    async fn refresh_full(&self, node: &Node, class: u64) -> Result<bool> {
        let full: Vec<(u64, ChunkShape)> = node
            .chunks
            .lock()
            .iter()
            .filter(|c| c.shape.object_size == class && c.pending == 0)
            .map(|c| (c.index, c.shape))
            .collect();
        let mut room = false;
        for (index, shape) in full {
            let bits = self.read_bitmap(node, index, shape).await?;
            let mut chunks = node.chunks.lock();
            if let Some(c) = chunks
                .iter_mut()
                .find(|c| c.index == index && c.pending == 0)
            {
                let before: u64 = c.bits.iter().map(|w| w.count_ones() as u64).sum();
                let after: u64 = bits.iter().map(|w| w.count_ones() as u64).sum();
                node.used.fetch_sub(
                    before.saturating_sub(after) * shape.object_size,
                    Ordering::Relaxed,
                );
                c.bits = bits;
                room |= c.free_bit().is_some();
            }
        }
        Ok(room)
    }

    /// Sets a free bit of an owned chunk of `class`, locally then remotely.
    pub(super) async fn alloc_in_owned(
        &self,
        node: &Node,
        class: u64,
        size: u64,
    ) -> Result<Option<RemotePtr>> {
        loop {
            let pick = {
                let mut chunks = node.chunks.lock();
                chunks
                    .iter_mut()
                    .find(|c| c.shape.object_size == class && c.free_bit().is_some())
                    .map(|c| {
                        let obj = c.free_bit().expect("checked");
                        let w = (obj / 64) as usize;
                        let expected = c.bits[w];
                        c.bits[w] |= 1 << (obj % 64);
                        c.pending += 1;
                        (c.index, c.shape, obj, expected)
                    })
            };
            let Some((index, shape, obj, mut expected)) = pick else {
                return Ok(None);
            };
            let l = node.desc.layout;
            let word_at = l.chunk(index) + layout::chunk::BITMAP + (obj / 64) * 8;
            let bit = 1u64 << (obj % 64);
            let result = loop {
                match self
                    .cas(node, node.remote(word_at), expected, expected | bit)
                    .await
                {
                    Ok(v) if v == expected => break Ok(true),
                    // Only we set bits here: a clash means our view was stale the other way
                    // (bits others cleared); retry on what is really there.
                    Ok(v) if v & bit == 0 => expected = v,
                    Ok(_) => break Ok(false), // set remotely: view lied; pick another
                    Err(e) => break Err(e),
                }
            };
            let mut chunks = node.chunks.lock();
            let view = chunks.iter_mut().find(|c| c.index == index);
            match result {
                Ok(true) => {
                    if let Some(c) = view {
                        c.pending -= 1;
                        c.bits[(obj / 64) as usize] = expected | bit;
                    }
                    node.used.fetch_add(shape.object_size, Ordering::Relaxed);
                    return Ok(Some(RemotePtr {
                        node: node.desc.node,
                        offset: l.chunk(index) + shape.first_object + obj * shape.object_size,
                        len: size,
                        incarnation: node.desc.incarnation,
                    }));
                }
                Ok(false) => {
                    if let Some(c) = view {
                        c.pending -= 1; // the bit stays set in the view: it is taken
                    }
                }
                Err(e) => {
                    if let Some(c) = view {
                        c.pending -= 1;
                        c.bits[(obj / 64) as usize] &= !bit;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Claims a free chunk with CAS on the table (probing from a hash of this id) and
    /// initialises its header for `class`. False when every chunk is taken.
    pub(super) async fn claim_chunk(&self, node: &Node, class: u64) -> Result<bool> {
        let l = node.desc.layout;
        let owned = node.chunks.lock().len() as u64;
        let start = hash64(self.id ^ owned.wrapping_mul(0x9e37)) % l.chunk_count;
        for k in 0..l.chunk_count {
            let i = (start + k) % l.chunk_count;
            let old = self
                .cas(node, node.remote(l.table_entry(i)), 0, self.id)
                .await?;
            if old != 0 {
                continue;
            }
            let shape = ChunkShape::new(l.chunk_size, class);
            self.init_chunk(node, i, shape).await?;
            node.shapes.lock().insert(i, class);
            node.chunks.lock().push(ChunkView {
                index: i,
                shape,
                bits: vec![0; shape.object_count.div_ceil(64) as usize],
                pending: 0,
            });
            return Ok(true);
        }
        Ok(false)
    }

    /// Writes a claimed chunk's header: a zeroed bitmap, then (in order on the same
    /// connection) the shape and the magic that makes it valid.
    pub(super) async fn init_chunk(
        &self,
        node: &Node,
        index: u64,
        shape: ChunkShape,
    ) -> Result<()> {
        let header_len = shape.first_object as usize;
        let staging = Arc::new(
            self.pd
                .alloc_mr(header_len.max(64), AccessFlags::LOCAL_WRITE)?,
        );
        let mut h = vec![0u8; layout::chunk::BITMAP as usize];
        for (field, value) in [
            (layout::chunk::MAGIC, layout::CHUNK_MAGIC),
            (layout::chunk::OWNER, self.id),
            (layout::chunk::OBJECT_SIZE, shape.object_size),
            (layout::chunk::OBJECT_COUNT, shape.object_count),
        ] {
            let at = field as usize;
            h[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        staging.write_at(0, &h)?;
        let chunk = node.desc.layout.chunk(index);
        let bitmap_len = (header_len - layout::chunk::BITMAP as usize) as u32;
        let bitmap = node.qp.write(
            LocalBuf::Region(staging),
            layout::chunk::BITMAP as usize,
            bitmap_len,
            node.remote(chunk + layout::chunk::BITMAP),
        );
        let (r, staging) = timed(&self.timers, node, bitmap).await;
        self.seen(node, r)?;
        let header = node
            .qp
            .write(staging, 0, layout::chunk::BITMAP as u32, node.remote(chunk));
        let (r, _) = timed(&self.timers, node, header).await;
        self.seen(node, r)?;
        Ok(())
    }

    /// Where `ptr`'s object is: its node, chunk and bitmap bit, after checking that `ptr`
    /// starts an object of an initialised chunk and fits in it (one or two READs when the
    /// chunk is not one of ours).
    async fn locate(&self, ptr: RemotePtr) -> Result<Located> {
        let node = self.node_of(ptr)?;
        let (index, shape, obj) = self.check_object(&node, ptr, true).await?;
        let chunk = node.desc.layout.chunk(index);
        Ok(Located {
            index,
            shape,
            word_at: chunk + layout::chunk::BITMAP + (obj / 64) * 8,
            bit: 1u64 << (obj % 64),
            obj,
            node,
        })
    }

    /// Whether `ptr` is a live allocation now: its chunk is initialised (a chunk the server
    /// took back from an expired lease is not) and its object's bit is set. One-sided, and
    /// only a snapshot: another client may free it, or allocate it again, right after.
    pub(super) async fn check_live(&self, ptr: RemotePtr) -> Result<()> {
        let at = self.locate(ptr).await?;
        if self.read_u64(&at.node, at.word_at).await? & at.bit == 0 {
            return Err(Error::NotAllocated(format!(
                "{ptr:?}: not allocated (freed, or its chunk was taken back when the lease of \
                 the client that allocated it ran out)"
            )));
        }
        Ok(())
    }

    pub(super) async fn free(&self, ptr: RemotePtr) -> Result<()> {
        let Located {
            node,
            index,
            shape,
            word_at,
            bit,
            obj,
        } = self.locate(ptr).await?;
        let bad = |why: &str| Error::NotAllocated(format!("{ptr:?}: {why}"));
        let mut expected = self.read_u64(&node, word_at).await?;
        loop {
            if expected & bit == 0 {
                return Err(bad("already free"));
            }
            let v = self
                .cas(&node, node.remote(word_at), expected, expected & !bit)
                .await?;
            if v == expected {
                break;
            }
            expected = v;
        }
        let mut release = false;
        if let Some(c) = node.chunks.lock().iter_mut().find(|c| c.index == index) {
            c.bits[(obj / 64) as usize] = expected & !bit;
            node.used.fetch_sub(shape.object_size, Ordering::Relaxed);
            release = c.is_empty();
        }
        if release {
            self.release_chunk(&node, index).await?;
        }
        Ok(())
    }

    /// Gives an empty owned chunk back to the table: invalidate its header, then release
    /// the entry. (Only the owner allocates in it, and it holds nothing.)
    pub(super) async fn release_chunk(&self, node: &Node, index: u64) -> Result<()> {
        {
            let mut chunks = node.chunks.lock();
            match chunks.iter().position(|c| c.index == index && c.is_empty()) {
                Some(p) => {
                    chunks.swap_remove(p);
                }
                None => return Ok(()), // something was allocated in it meanwhile
            }
        }
        node.shapes.lock().remove(&index);
        let l = node.desc.layout;
        let chunk = l.chunk(index);
        // Zero the magic with a CAS (no staging buffer needed): frees now fail cleanly.
        self.cas(
            node,
            node.remote(chunk + layout::chunk::MAGIC),
            layout::CHUNK_MAGIC,
            0,
        )
        .await?;
        self.cas(node, node.remote(l.table_entry(index)), self.id, 0)
            .await?;
        Ok(())
    }
}

/// An object found by [`Shared::locate`].
struct Located {
    node: Arc<Node>,
    index: u64,
    shape: ChunkShape,
    word_at: u64,
    bit: u64,
    obj: u64,
}
