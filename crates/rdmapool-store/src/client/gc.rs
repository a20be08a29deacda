//! Space (docs/STORE.md section 8): what frees the store's blocks.
//!
//! - **Retired blocks**: the blocks a put, a remove or a repair replaced are kept until the
//!   grace period has passed, then freed if they still hold what was retired.
//! - **Gone writers' space**: a repair looks at the store chunks of every client id that
//!   holds no lease on the node any more. Blocks allocated there that no index slot names (a
//!   put that died before its publish, a replaced block whose freeing client died before its
//!   grace period passed) are freed once two repairs, at least twice the grace period apart,
//!   found them so; a chunk left empty, or never formatted, is given back to the pool. Only
//!   the writer allocates in its chunks, and it is gone, so nothing new can appear in them;
//!   the second look covers frees that were already under way. A writer frozen for longer
//!   than its lease that wakes up may lose the put it was making (as a pool client does:
//!   the lease is the fence).

use super::{incarnation, Store};
use crate::format::{peek, Version, HEADER_LEN};
use crate::lookup::Replica;
use futures_util::future::{join_all, BoxFuture, Either};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::ArcWake;
use rdmapool_pool::remote::layout::DURABLE_TAG;
use rdmapool_pool::remote::layout::{self, ChunkShape, CHUNK_MAGIC, CLIENT_SLOT, TABLE_ENTRY};
use rdmapool_pool::remote::regions::RegionNode;
use rdmapool_pool::Result;
use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// The most replaced blocks a put starts freeing, in batches (one per node).
pub(super) const FREES_PER_PUT: usize = 32;

/// The most batches of frees under way at once.
const BATCHES_IN_FLIGHT: usize = 4;

/// Due blocks past which a put waits for the frees under way (they fell behind).
const BEHIND: usize = 4 * FREES_PER_PUT;

/// The batches of frees under way (each answers how many blocks it freed), polled by
/// whichever of this client's operations waits on them, several at once (a `get_many`'s
/// reclaims, a cache's evictions): every task that polled since the last progress is woken
/// when a batch makes progress (the last [`WAITERS`] of them). (A `FuturesUnordered`
/// alone wakes only the last to poll: the others, waiting for the same batches, would
/// never be woken.)
pub(super) struct Freeing {
    batches: FuturesUnordered<BoxFuture<'static, usize>>,
    waiters: Arc<Waiters>,
}

/// The tasks waiting on [`Freeing`]'s batches.
#[derive(Default)]
struct Waiters(parking_lot::Mutex<Vec<Waker>>);

/// The most tasks [`Freeing`] remembers (the oldest are forgotten first: a task woken
/// polls again and is remembered anew).
const WAITERS: usize = 64;

impl ArcWake for Waiters {
    fn wake_by_ref(this: &Arc<Self>) {
        // Kept, not drained: a task woken early (a poll that yields) still waits. A task
        // that stopped waiting is woken for nothing, which costs it a poll.
        for w in this.0.lock().iter() {
            w.wake_by_ref();
        }
    }
}

impl Freeing {
    pub(super) fn new() -> Self {
        Self {
            batches: FuturesUnordered::new(),
            waiters: Arc::new(Waiters::default()),
        }
    }

    fn len(&self) -> usize {
        self.batches.len()
    }

    fn push(&self, batch: BoxFuture<'static, usize>) {
        self.batches.push(batch);
    }

    /// The next batch that ended, polled for `cx`'s task and woken with every other task
    /// that polled since the last progress.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<usize>> {
        {
            let mut waiters = self.waiters.0.lock();
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                if waiters.len() == WAITERS {
                    waiters.remove(0);
                }
                waiters.push(cx.waker().clone());
            }
        }
        let all = futures_util::task::waker(Arc::clone(&self.waiters));
        self.batches.poll_next_unpin(&mut Context::from_waker(&all))
    }
}

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
    /// Frees the replaced blocks whose grace period has passed (and waits for the frees
    /// under way), and clears the parts of replaced striped values whose grace period has
    /// passed; how many blocks.
    pub async fn flush_retired(&self) -> usize {
        let mut freed = 0;
        loop {
            self.start_frees(usize::MAX);
            std::future::poll_fn(|cx| {
                let (n, left) = self.drive_frees(cx);
                freed += n;
                if left == 0 {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            if self.due_now() == 0 {
                break;
            }
        }
        freed + self.flush_parts().await
    }

    /// How many retired blocks are due now.
    fn due_now(&self) -> usize {
        let now = Instant::now();
        self.retired
            .lock()
            .iter()
            .take_while(|b| now >= b.due)
            .count()
    }

    /// When the last of the blocks and parts this client retired comes due (the queues
    /// are in order of their due times), or `None` when none waits.
    pub(super) fn retired_due(&self) -> Option<Instant> {
        let blocks = self.retired.lock().back().map(|b| b.due);
        let parts = self.retired_parts.lock().back().map(|(t, _)| *t);
        blocks.max(parts)
    }

    /// Starts freeing up to `most` of the blocks whose grace period has passed, a batch
    /// per node, if fewer than [`BATCHES_IN_FLIGHT`] are under way. They go on while this
    /// client's later puts and removes run ([`Store::beside_frees`]), and `flush_retired`
    /// waits for them.
    pub(super) fn start_frees(&self, most: usize) {
        let now = Instant::now();
        let freeing = self.freeing.lock();
        if freeing.len() >= BATCHES_IN_FLIGHT {
            return;
        }
        let due: Vec<Retired> = {
            let mut r = self.retired.lock();
            let n = r.iter().take(most).take_while(|b| now >= b.due).count();
            r.drain(..n).collect()
        };
        let mut by_node: Vec<Vec<Retired>> = Vec::new();
        for b in due {
            match by_node
                .iter_mut()
                .find(|g| (g[0].node, g[0].incarnation) == (b.node, b.incarnation))
            {
                Some(g) => g.push(b),
                None => by_node.push(vec![b]),
            }
        }
        for batch in by_node {
            freeing.push(self.free_retired(batch));
        }
    }

    /// The frees of retired blocks of one node, each freed only if it still holds what was
    /// retired: a block repair reclaimed meanwhile (docs/STORE.md section 8) may hold
    /// someone else's object now. Two round trips for the batch (`Regions::free_many_if`):
    /// the blocks' headers and keys READ beside the chunk headers the frees check, then one
    /// swap per bitmap word. A block that cannot be freed now (its node is down, or
    /// restarted and its memory gone) is left: repair reclaims unnamed blocks.
    fn free_retired(&self, batch: Vec<Retired>) -> BoxFuture<'static, usize> {
        let pool = Arc::clone(&self.pool);
        Box::pin(async move {
            let (node, incarnation) = (batch[0].node, batch[0].incarnation);
            let blocks: Vec<(u64, u64)> = batch
                .iter()
                .map(|b| (b.at, (HEADER_LEN + b.key.len()) as u64))
                .collect();
            let still_its = |i: usize, bytes: &[u8]| {
                let b = &batch[i];
                matches!(peek(bytes), Some(p) if p.key == b.key && p.version == b.version)
            };
            pool.regions()
                .free_many_if(node, incarnation, &blocks, still_its)
                .await
                .unwrap_or(0)
        })
    }

    /// Whether the frees fell behind: more blocks are due than a few puts start freeing.
    pub(super) fn frees_behind(&self) -> bool {
        self.due_now() > BEHIND
    }

    /// Waits for the frees under way.
    pub(super) async fn frees_under_way(&self) {
        std::future::poll_fn(|cx| {
            if self.drive_frees(cx).1 == 0 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// Polls the frees under way: how many blocks the batches that finished on this poll
    /// freed, and how many batches are still under way.
    fn drive_frees(&self, cx: &mut Context<'_>) -> (usize, usize) {
        let mut freeing = self.freeing.lock();
        let mut freed = 0;
        while let Poll::Ready(Some(n)) = freeing.poll_next(cx) {
            freed += n;
        }
        self.counters
            .freed
            .fetch_add(freed as u64, std::sync::atomic::Ordering::Relaxed);
        (freed, freeing.len())
    }

    /// Runs `fut`, driving the frees under way while it waits, and returns its output as
    /// soon as it has it: a put does not wait for the frees beside it (docs/STORE.md
    /// section 8); what is left goes on beside the next operation, a get's too.
    ///
    /// Nothing else polls the frees, and an operation they posted holds its send-queue
    /// entries until its future is polled again, even once it has completed: a `get_many`
    /// whose list on a server was as deep as the queue waited for that room for good
    /// behind frees left by the last put (the hit-rate bench's stall, issue #44).
    pub(super) async fn beside_frees<F: Future>(&self, fut: F) -> F::Output {
        if self.freeing.lock().len() == 0 {
            // None under way (a batch started inside `fut` runs beside what started it).
            return fut.await;
        }
        let drive = std::future::poll_fn(|cx| {
            self.drive_frees(cx);
            Poll::<()>::Pending
        });
        let (fut, drive) = (std::pin::pin!(fut), std::pin::pin!(drive));
        match futures_util::future::select(fut, drive).await {
            Either::Left((out, _)) => out,
            Either::Right(((), _)) => unreachable!("driving the frees never ends by itself"),
        }
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
    fn retired_blocks(&self) -> std::collections::HashSet<(u32, u64)> {
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

/// A block seen allocated and unnamed in a dead writer's chunk: node, incarnation, offset.
pub(super) type Unnamed = (u32, u64, u64);

/// What the last repair found, waiting for the next one's second look.
pub(super) type Pending = crate::timing::SecondLook<Unnamed>;

/// A store chunk whose writer holds no lease on the node.
#[derive(Debug)]
struct DeadChunk {
    chunk: u64,
    entry: u64,
    /// Its object size's shape; `None` when it was never formatted.
    shape: Option<ChunkShape>,
    /// Objects allocated in it.
    allocated: usize,
    /// Offsets of those no index slot names.
    unnamed: Vec<u64>,
}

/// What a reclaim pass did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Reclaimed {
    pub(super) freed: usize,
    pub(super) released: usize,
    pub(super) pending: usize,
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
}

impl Store {
    /// The client ids that hold a lease slot on `n` now (one READ of the slots' owner
    /// words; 0, a free slot, among them).
    pub(super) async fn lease_holders(&self, n: &RegionNode) -> Result<HashSet<u64>> {
        let l = n.layout;
        let slots = self
            .pool
            .regions()
            .read(
                n.node,
                n.incarnation,
                l.client_slot(0),
                l.client_count * CLIENT_SLOT,
            )
            .await?;
        Ok(words(&slots).step_by((CLIENT_SLOT / 8) as usize).collect())
    }

    /// The store chunks on `n` of writers with no lease there, except the index's, with
    /// their allocated objects that `named` (every offset an index slot names) leaves out.
    async fn dead_chunks(&self, n: &RegionNode, named: &HashSet<u64>) -> Result<Vec<DeadChunk>> {
        if n.isolated {
            // A tenant's namespace has one writer, this client: none of its chunks is a
            // gone writer's, and another tenant's are out of its reach.
            return Ok(Vec::new());
        }
        let l = n.layout;
        let (node, inc) = (n.node, n.incarnation);
        let leased = self.lease_holders(n).await?;
        let table = self
            .pool
            .regions()
            .read(node, inc, l.table_entry(0), l.chunk_count * TABLE_ENTRY)
            .await?;
        let index = self.index(n).await?.chunk;
        let dead: Vec<(u64, u64)> = words(&table)
            .step_by((TABLE_ENTRY / 8) as usize)
            .enumerate()
            .map(|(j, e)| (j as u64, e))
            .filter(|&(j, e)| {
                e & DURABLE_TAG != 0 && j != index && !leased.contains(&(e & !DURABLE_TAG))
            })
            .collect();
        let mut out = Vec::new();
        for (chunk, entry) in dead {
            let at = l.chunk(chunk);
            let head = self
                .pool
                .regions()
                .read(node, inc, at, layout::chunk::BITMAP)
                .await?;
            let h: Vec<u64> = words(&head).collect();
            if h[0] != CHUNK_MAGIC {
                out.push(DeadChunk {
                    chunk,
                    entry,
                    shape: None,
                    allocated: 0,
                    unnamed: vec![],
                });
                continue;
            }
            let size = h[(layout::chunk::OBJECT_SIZE / 8) as usize];
            if !layout::is_class(size, l.chunk_size) {
                continue; // damaged: left alone
            }
            let shape = ChunkShape::new(l.chunk_size, size);
            let bitmap_words = (l.chunk_size / size).div_ceil(64);
            let bits = self
                .pool
                .regions()
                .read(node, inc, at + layout::chunk::BITMAP, bitmap_words * 8)
                .await?;
            let mut allocated = 0;
            let mut unnamed = Vec::new();
            for (w, word) in words(&bits).enumerate() {
                for b in 0..64 {
                    let o = w as u64 * 64 + b;
                    if word & (1 << b) == 0 || o >= shape.object_count {
                        continue;
                    }
                    allocated += 1;
                    let offset = at + shape.first_object + o * size;
                    if !named.contains(&offset) {
                        unnamed.push(offset);
                    }
                }
            }
            out.push(DeadChunk {
                chunk,
                entry,
                shape: Some(shape),
                allocated,
                unnamed,
            });
        }
        Ok(out)
    }

    /// One reclaim pass over `nodes`, `named` holding per node every offset an index slot
    /// names (from the repair's scan).
    pub(super) async fn reclaim(
        &self,
        nodes: &[RegionNode],
        named: &std::collections::HashMap<u32, HashSet<u64>>,
    ) -> Result<Reclaimed> {
        let empty = HashSet::new();
        let mine: HashSet<(u32, u64)> = self.retired_blocks();
        let mut found: Vec<(RegionNode, Vec<DeadChunk>)> = Vec::new();
        for n in nodes {
            let chunks = self
                .dead_chunks(n, named.get(&n.node).unwrap_or(&empty))
                .await?;
            found.push((*n, chunks));
        }
        let seen: HashSet<Unnamed> = found
            .iter()
            .flat_map(|(n, cs)| {
                cs.iter()
                    .flat_map(move |c| c.unnamed.iter().map(move |&at| (n.node, n.incarnation, at)))
            })
            .filter(|&(node, _, at)| !mine.contains(&(node, at)))
            .collect();
        // The second look: free what the last pass found too, if it was long enough ago.
        let due = self
            .reclaim
            .lock()
            .look(&seen, Instant::now(), self.cfg.grace * 2);
        let freed = join_all(due.iter().map(|&(node, inc, at)| async move {
            ((node, at), self.pool.regions().free(node, inc, at).await)
        }))
        .await;
        let freed: HashSet<(u32, u64)> = freed
            .into_iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(b, _)| b)
            .collect();
        let mut out = Reclaimed {
            freed: freed.len(),
            pending: self.reclaim.lock().pending(),
            ..Reclaimed::default()
        };
        // Chunks left with nothing allocated go back to the pool.
        for (n, chunks) in &found {
            for c in chunks {
                let gone = c.unnamed.iter().filter(|&&a| freed.contains(&(n.node, a)));
                let left = c.allocated - gone.count();
                if left == 0 && self.release(n, c).await {
                    out.released += 1;
                }
            }
        }
        Ok(out)
    }

    /// Gives a dead writer's empty (or never formatted) chunk back: its magic zeroed, its
    /// bitmap read again (anything allocated meanwhile puts the magic back and keeps it),
    /// then its table entry swapped from the writer's tag to 0.
    async fn release(&self, n: &RegionNode, c: &DeadChunk) -> bool {
        let l = n.layout;
        let (node, inc) = (n.node, n.incarnation);
        let at = l.chunk(c.chunk);
        if let Some(shape) = c.shape {
            let magic = at + layout::chunk::MAGIC;
            if self
                .pool
                .regions()
                .cas(node, inc, magic, CHUNK_MAGIC, 0)
                .await
                .ok()
                != Some(CHUNK_MAGIC)
            {
                return false;
            }
            let bitmap_words = (l.chunk_size / shape.object_size).div_ceil(64);
            let bits = self
                .pool
                .regions()
                .read(node, inc, at + layout::chunk::BITMAP, bitmap_words * 8)
                .await;
            if bits.map_or(true, |b| words(&b).any(|w| w != 0)) {
                let _ = self
                    .pool
                    .regions()
                    .cas(node, inc, magic, 0, CHUNK_MAGIC)
                    .await;
                return false;
            }
        }
        let entry = l.table_entry(c.chunk);
        self.pool
            .regions()
            .cas(node, inc, entry, c.entry, 0)
            .await
            .ok()
            == Some(c.entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(AtomicUsize);

    impl ArcWake for Count {
        fn wake_by_ref(this: &Arc<Self>) {
            this.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Two operations of one client wait on the same frees (as two reclaims of a
    /// `get_many` do): both are woken when the batch ends, not only the last to poll.
    #[test]
    fn every_task_waiting_on_the_frees_is_woken_when_they_progress() {
        let (send, recv) = tokio::sync::oneshot::channel::<usize>();
        let mut freeing = Freeing::new();
        freeing.push(Box::pin(async move { recv.await.unwrap_or(0) }));
        let counts: Vec<Arc<Count>> = (0..2)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        for c in &counts {
            let w = futures_util::task::waker(Arc::clone(c));
            assert!(freeing.poll_next(&mut Context::from_waker(&w)).is_pending());
        }
        // (A poll may wake its own task at once, to yield: count from here.)
        let before: Vec<usize> = counts.iter().map(|c| c.0.load(Ordering::SeqCst)).collect();
        send.send(5).unwrap();
        for (c, b) in counts.iter().zip(before) {
            assert!(
                c.0.load(Ordering::SeqCst) > b,
                "a waiting task was not woken"
            );
        }
        let w = futures_util::task::waker(Arc::clone(&counts[0]));
        assert_eq!(
            freeing.poll_next(&mut Context::from_waker(&w)),
            Poll::Ready(Some(5))
        );
    }
}
