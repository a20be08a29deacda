//! The pool client: connects to memory servers, learns each one from its descriptor, and
//! allocates, frees, reads, writes and updates remote memory with one-sided operations only.

use super::descriptor::{ClientHello, PoolDescriptor};
use super::layout::{self, size_class, ChunkShape, STATE_DRAINING};
use super::membership::Membership;
use super::placement::{NodeLoad, Placement, RoundRobin};
use super::RemotePtr;
use crate::conn::{self, Manager};
use crate::cq::{AsyncQp, Engine, EngineConfig, LocalBuf, Progress};
use crate::fabric::{AccessFlags, Context, Mr, Pd, QpConfig, RegisteredMemory, RemoteAddr};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a client runs.
pub struct ClientConfig {
    /// Who this client is (non-zero). A client restarted with the same id finds the
    /// allocations its predecessor made, if its lease has not expired meanwhile.
    pub client_id: u64,
    /// Where new allocations go.
    pub placement: Box<dyn Placement>,
    /// Who polls completions ([`Progress::Caller`]: whoever awaits, through
    /// [`PoolClient::block_on`]; [`Progress::Event`] inside a tokio runtime).
    pub progress: Progress,
    /// How long connecting to a server may take.
    pub connect_timeout: Duration,
}

impl ClientConfig {
    /// Defaults for `client_id`: round-robin placement, caller-driven progress, 5 s connect.
    pub fn new(client_id: u64) -> Self {
        Self {
            client_id,
            placement: Box::new(RoundRobin::default()),
            progress: Progress::Caller,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// A chunk this client owns: its shape and what it knows of its bitmap (the client is the
/// only one that sets bits; others only clear them, so a set bit here may be stale, a clear
/// one never is).
struct ChunkView {
    index: u64,
    shape: ChunkShape,
    bits: Vec<u64>,
    /// Objects reserved locally and not yet committed remotely.
    pending: u64,
}

impl ChunkView {
    fn free_bit(&self) -> Option<u64> {
        for (w, &word) in self.bits.iter().enumerate() {
            if word != u64::MAX {
                let bit = (!word).trailing_zeros() as u64;
                let obj = w as u64 * 64 + bit;
                if obj < self.shape.object_count {
                    return Some(obj);
                }
            }
        }
        None
    }

    fn is_empty(&self) -> bool {
        self.pending == 0 && self.bits.iter().all(|&w| w == 0)
    }
}

/// One memory server as this client uses it.
struct Node {
    desc: PoolDescriptor,
    qp: AsyncQp,
    /// Offset of this client's lease slot (set once it is taken).
    slot: AtomicU64,
    chunks: Mutex<Vec<ChunkView>>,
    /// Chunk claims of this client on this node, one at a time.
    claiming: tokio::sync::Mutex<()>,
    down: Mutex<Option<String>>,
    draining: AtomicBool,
    last_renewal: Mutex<Instant>,
    used: AtomicU64,
}

impl Node {
    fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.desc.region.addr + offset,
            rkey: self.desc.region.rkey,
        }
    }

    fn check_up(&self) -> Result<()> {
        match &*self.down.lock() {
            Some(reason) => Err(Error::NodeDown {
                node: self.desc.node,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn mark_down(&self, reason: String) {
        tracing::warn!(node = self.desc.node, "pool node down: {reason}");
        self.down.lock().get_or_insert(reason);
    }
}

/// Registered scratch words for atomics results and staged chunk headers.
struct Scratch {
    mr: Arc<Mr>,
    free: Mutex<Vec<usize>>,
}

/// One scratch word, given back on drop.
struct Word {
    scratch: Arc<Scratch>,
    offset: usize,
}

impl Drop for Word {
    fn drop(&mut self) {
        self.scratch.free.lock().push(self.offset);
    }
}

struct Shared {
    id: u64,
    pd: Pd,
    engine: Engine,
    nodes: Mutex<HashMap<u32, Arc<Node>>>,
    placement: Mutex<Box<dyn Placement>>,
    scratch: Arc<Scratch>,
    stop: AtomicBool,
    connect_timeout: Duration,
    timers: Timers,
}

/// A client of the remote memory pool (see the module docs).
pub struct PoolClient {
    shared: Arc<Shared>,
    lease_thread: Option<std::thread::JoinHandle<()>>,
}

const SCRATCH_WORDS: usize = 4096;

impl PoolClient {
    /// Connects to every server `membership` lists (a server that cannot be reached is
    /// skipped and reported; at least one must answer). Its QPs live on `pd`, so buffers
    /// registered on `pd` are what reads and writes move data through, without copies.
    pub fn connect(
        ctx: &Context,
        pd: &Pd,
        membership: &dyn Membership,
        cfg: ClientConfig,
    ) -> Result<Self> {
        if cfg.client_id == 0 {
            return Err(Error::InvalidArgument("client id 0".into()));
        }
        let pd = pd.clone();
        let cq = ctx.create_cq(8192)?;
        let engine = Engine::new(
            vec![cq],
            EngineConfig {
                progress: cfg.progress,
                ..EngineConfig::default()
            },
        )?;
        let mr = Arc::new(pd.alloc_mr(SCRATCH_WORDS * 8, AccessFlags::LOCAL_WRITE)?);
        let scratch = Arc::new(Scratch {
            mr,
            free: Mutex::new((0..SCRATCH_WORDS).map(|i| i * 8).collect()),
        });
        let shared = Arc::new(Shared {
            id: cfg.client_id,
            pd,
            engine,
            nodes: Mutex::new(HashMap::new()),
            placement: Mutex::new(cfg.placement),
            scratch,
            stop: AtomicBool::new(false),
            connect_timeout: cfg.connect_timeout,
            timers: Mutex::new(Vec::new()),
        });
        let mut errors = Vec::new();
        let members = membership.servers()?;
        for addr in &members {
            if let Err(e) = shared.add_node(*addr) {
                errors.push(format!("{addr}: {e}"));
            }
        }
        if shared.nodes.lock().is_empty() {
            return Err(Error::Connection {
                peer: format!("{members:?}"),
                reason: format!("no memory server answered: {}", errors.join("; ")),
            });
        }
        let s = shared.clone();
        let lease_thread = std::thread::Builder::new()
            .name("rdmapool-pool-lease".into())
            .spawn(move || s.lease_loop())
            .map_err(|e| Error::Sys {
                call: "spawn",
                source: e,
            })?;
        Ok(Self {
            shared,
            lease_thread: Some(lease_thread),
        })
    }

    /// The protection domain its QPs live on: register local buffers here.
    pub fn pd(&self) -> &Pd {
        &self.shared.pd
    }

    /// Connects to one more server (membership grew).
    pub fn add_server(&self, addr: SocketAddr) -> Result<u32> {
        self.shared.add_node(addr)
    }

    /// Stops using a server (membership shrank): its pointers fail with `NodeDown`.
    pub fn remove_server(&self, node: u32) {
        if let Some(n) = self.shared.nodes.lock().remove(&node) {
            n.mark_down("left the membership".into());
        }
    }

    /// The nodes this client uses, with what it knows of them.
    pub fn nodes(&self) -> Vec<NodeLoad> {
        self.shared.loads()
    }

    /// Runs `fut` on this thread, polling the client's completions meanwhile (for
    /// caller-driven progress, and for synchronous callers in any mode).
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        self.shared.engine.run_until(fut)
    }

    /// Allocates `size` bytes somewhere in the pool. `key` steers hash placement.
    pub async fn alloc(&self, size: u64, key: Option<u64>) -> Result<RemotePtr> {
        self.shared.alloc(size, key).await
    }

    /// Frees an allocation (any client may free any allocation).
    pub async fn free(&self, ptr: RemotePtr) -> Result<()> {
        self.shared.free(ptr).await
    }

    /// Writes `len` bytes of `local` (from `local_offset`) at `offset` of `ptr`.
    pub async fn write<B: RegisteredMemory + Send + 'static>(
        &self,
        ptr: RemotePtr,
        offset: u64,
        local: B,
        local_offset: usize,
        len: u32,
    ) -> (Result<()>, B) {
        let (node, remote) = match self.shared.target(ptr, offset, len as u64) {
            Ok(t) => t,
            Err(e) => return (Err(e), local),
        };
        let (r, b) = timed(
            &self.shared.timers,
            &node,
            node.qp.write(local, local_offset, len, remote),
        )
        .await;
        (self.shared.seen(&node, r).map(|_| ()), b)
    }

    /// Reads `len` bytes at `offset` of `ptr` into `local` (at `local_offset`).
    pub async fn read<B: RegisteredMemory + Send + 'static>(
        &self,
        ptr: RemotePtr,
        offset: u64,
        local: B,
        local_offset: usize,
        len: u32,
    ) -> (Result<()>, B) {
        let (node, remote) = match self.shared.target(ptr, offset, len as u64) {
            Ok(t) => t,
            Err(e) => return (Err(e), local),
        };
        let (r, b) = timed(
            &self.shared.timers,
            &node,
            node.qp.read(local, local_offset, len, remote),
        )
        .await;
        (self.shared.seen(&node, r).map(|_| ()), b)
    }

    /// Compare-and-swap on the 8-byte word at `offset` of `ptr`; returns the old value.
    pub async fn compare_and_swap(
        &self,
        ptr: RemotePtr,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        let (node, remote) = self.shared.target(ptr, offset, 8)?;
        self.shared.cas(&node, remote, compare, swap).await
    }

    /// Fetch-and-add on the 8-byte word at `offset` of `ptr`; returns the old value.
    pub async fn fetch_and_add(&self, ptr: RemotePtr, offset: u64, add: u64) -> Result<u64> {
        let (node, remote) = self.shared.target(ptr, offset, 8)?;
        self.shared.faa(&node, remote, add).await
    }

    /// The live allocations in this client's chunks, read from the servers (after a restart
    /// with the same id, what the predecessor allocated). Lengths are the objects' sizes.
    pub async fn allocations(&self) -> Result<Vec<RemotePtr>> {
        let mut out = Vec::new();
        for node in self.shared.live_nodes() {
            let views: Vec<(u64, ChunkShape)> = node
                .chunks
                .lock()
                .iter()
                .map(|c| (c.index, c.shape))
                .collect();
            for (index, shape) in views {
                let bits = self.shared.read_bitmap(&node, index, shape).await?;
                let base = node.desc.layout.chunk(index) + shape.first_object;
                for obj in 0..shape.object_count {
                    if bits[(obj / 64) as usize] & (1 << (obj % 64)) != 0 {
                        out.push(RemotePtr {
                            node: node.desc.node,
                            offset: base + obj * shape.object_size,
                            len: shape.object_size,
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Drop for PoolClient {
    fn drop(&mut self) {
        // Stops renewing: chunks stay ours until the lease runs out (a clean close would
        // free them first; a crash looks the same from the server).
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.lease_thread.take() {
            let _ = t.join();
        }
    }
}

/// How long one operation may stay outstanding before its node is declared down. (Some
/// devices never complete a request to a peer that vanished: rxe on Linux 6.1 does not.)
const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Awaits an operation on `node`; past [`OP_TIMEOUT`] the node is marked down and its QP
/// moved to ERR, which flushes the operation (so its buffer still comes back).
async fn timed<B>(
    timers: &Timers,
    node: &Node,
    op: impl Future<Output = (Result<crate::cq::OpCompletion>, B)>,
) -> (Result<crate::cq::OpCompletion>, B) {
    Timed {
        op: std::pin::pin!(op),
        node,
        timers,
        deadline: Instant::now() + OP_TIMEOUT,
        fired: false,
        registered: false,
    }
    .await
}

/// Deadlines of operations whose tasks wait to be woken (the lease thread wakes them).
type Timers = Mutex<Vec<(Instant, std::task::Waker)>>;

struct Timed<'a, F> {
    op: std::pin::Pin<&'a mut F>,
    node: &'a Node,
    timers: &'a Timers,
    deadline: Instant,
    fired: bool,
    /// Whether the lease thread was asked to wake the task at the deadline (caller-driven
    /// polling needs no wake-up, but another executor would not poll again).
    registered: bool,
}

impl<F: Future> Future for Timed<'_, F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        if let std::task::Poll::Ready(v) = self.op.as_mut().poll(cx) {
            return std::task::Poll::Ready(v);
        }
        if !self.fired {
            if Instant::now() >= self.deadline {
                self.fired = true;
                self.node.mark_down(format!(
                    "an operation got no completion within {OP_TIMEOUT:?}"
                ));
                self.node.qp.qp().modify_to_error();
                cx.waker().wake_by_ref();
            } else if !self.registered {
                self.registered = true;
                self.timers.lock().push((self.deadline, cx.waker().clone()));
            }
        }
        std::task::Poll::Pending
    }
}

fn hash64(mut x: u64) -> u64 {
    // splitmix64: spreads client ids over the tables.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Shared {
    fn word(&self) -> Result<Word> {
        let offset = self.scratch.free.lock().pop().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "more than {SCRATCH_WORDS} remote atomics in flight at once"
            ))
        })?;
        Ok(Word {
            scratch: self.scratch.clone(),
            offset,
        })
    }

    /// Turns a failed operation on `node` into `NodeDown` when the connection is gone.
    fn seen<T>(&self, node: &Node, r: Result<T>) -> Result<T> {
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

    async fn cas(&self, node: &Node, remote: RemoteAddr, compare: u64, swap: u64) -> Result<u64> {
        node.check_up()?;
        let w = self.word()?;
        let buf = LocalBuf::Region(self.scratch.mr.clone());
        let op = node
            .qp
            .compare_and_swap(buf, w.offset, remote, compare, swap);
        let (r, _) = timed(&self.timers, node, op).await;
        self.seen(node, r)?;
        self.scratch.mr.read_u64(w.offset)
    }

    async fn faa(&self, node: &Node, remote: RemoteAddr, add: u64) -> Result<u64> {
        node.check_up()?;
        let w = self.word()?;
        let buf = LocalBuf::Region(self.scratch.mr.clone());
        let (r, _) = timed(
            &self.timers,
            node,
            node.qp.fetch_and_add(buf, w.offset, remote, add),
        )
        .await;
        self.seen(node, r)?;
        self.scratch.mr.read_u64(w.offset)
    }

    async fn read_u64(&self, node: &Node, offset: u64) -> Result<u64> {
        node.check_up()?;
        let w = self.word()?;
        let buf = LocalBuf::Region(self.scratch.mr.clone());
        let (r, _) = timed(
            &self.timers,
            node,
            node.qp.read(buf, w.offset, 8, node.remote(offset)),
        )
        .await;
        self.seen(node, r)?;
        self.scratch.mr.read_u64(w.offset)
    }

    /// Connects, takes a lease slot, and (after a restart) recovers this id's chunks.
    fn add_node(&self, addr: SocketAddr) -> Result<u32> {
        let cq = self.engine.cqs()[0].clone();
        let hello = ClientHello { client_id: self.id }.encode();
        let c = conn::connect(
            Manager::from(&self.pd),
            addr,
            &self.pd,
            &cq,
            &cq,
            &QpConfig::default(),
            &hello,
            self.connect_timeout,
        )?;
        let desc = PoolDescriptor::decode(&c.private_data)?;
        if self.nodes.lock().contains_key(&desc.node) {
            return Err(Error::InvalidArgument(format!(
                "two servers call themselves node {}",
                desc.node
            )));
        }
        let node = Arc::new(Node {
            desc,
            qp: self.engine.wrap(c.qp),
            slot: AtomicU64::new(0),
            chunks: Mutex::new(Vec::new()),
            claiming: tokio::sync::Mutex::new(()),
            down: Mutex::new(None),
            draining: AtomicBool::new(false),
            last_renewal: Mutex::new(Instant::now()),
            used: AtomicU64::new(0),
        });
        let slot = self.engine.run_until(self.take_slot(&node))?;
        node.slot.store(slot, Ordering::Release);
        self.engine.run_until(self.recover(&node))?;
        self.nodes.lock().insert(desc.node, node);
        Ok(desc.node)
    }

    /// Claims this id's lease slot (probing from its hash). A slot already holding the id
    /// is a restart if its heartbeat stands still for half a lease, else `ClientIdInUse`.
    async fn take_slot(&self, node: &Node) -> Result<u64> {
        let l = node.desc.layout;
        let start = hash64(self.id) % l.client_count;
        for k in 0..l.client_count {
            let at = l.client_slot((start + k) % l.client_count);
            let old = self.cas(node, node.remote(at), 0, self.id).await?;
            if old == 0 {
                return Ok(at);
            }
            if old == self.id {
                let before = self.read_u64(node, at + 8).await?;
                let wait = Instant::now() + node.desc.lease / 2;
                while Instant::now() < wait {
                    std::thread::sleep(Duration::from_millis(5));
                    if self.read_u64(node, at + 8).await? != before {
                        return Err(Error::ClientIdInUse {
                            id: self.id,
                            node: node.desc.node,
                        });
                    }
                }
                return Ok(at);
            }
        }
        Err(Error::InvalidArgument(format!(
            "node {}: all {} client slots are taken",
            node.desc.node, l.client_count
        )))
    }

    /// Finds the chunks the table says this id owns and rebuilds their views.
    async fn recover(&self, node: &Node) -> Result<()> {
        let l = node.desc.layout;
        for i in 0..l.chunk_count {
            if self.read_u64(node, l.table_entry(i)).await? != self.id {
                continue;
            }
            let chunk = l.chunk(i);
            let magic = self.read_u64(node, chunk + layout::chunk::MAGIC).await?;
            let size = self
                .read_u64(node, chunk + layout::chunk::OBJECT_SIZE)
                .await?;
            if magic != layout::CHUNK_MAGIC || size == 0 || size > l.chunk_size {
                continue; // claimed but never initialised: the reaper or a free takes it
            }
            let shape = ChunkShape::new(l.chunk_size, size);
            let bits = self.read_bitmap(node, i, shape).await?;
            let used = bits.iter().map(|w| w.count_ones() as u64).sum::<u64>() * size;
            node.used.fetch_add(used, Ordering::Relaxed);
            node.chunks.lock().push(ChunkView {
                index: i,
                shape,
                bits,
                pending: 0,
            });
        }
        Ok(())
    }

    async fn read_bitmap(&self, node: &Node, index: u64, shape: ChunkShape) -> Result<Vec<u64>> {
        let words = shape.object_count.div_ceil(64) as usize;
        let base = node.desc.layout.chunk(index) + layout::chunk::BITMAP;
        let mut bits = Vec::with_capacity(words);
        for w in 0..words {
            bits.push(self.read_u64(node, base + w as u64 * 8).await?);
        }
        Ok(bits)
    }

    fn live_nodes(&self) -> Vec<Arc<Node>> {
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

    fn loads(&self) -> Vec<NodeLoad> {
        self.live_nodes()
            .iter()
            .map(|n| NodeLoad {
                node: n.desc.node,
                capacity: n.desc.layout.chunk_count * n.desc.layout.chunk_size,
                used: n.used.load(Ordering::Relaxed),
                draining: n.draining.load(Ordering::Relaxed),
            })
            .collect()
    }

    fn node(&self, id: u32) -> Result<Arc<Node>> {
        let n = self
            .nodes
            .lock()
            .get(&id)
            .cloned()
            .ok_or_else(|| Error::NodeDown {
                node: id,
                reason: "not a member".into(),
            })?;
        n.check_up()?;
        Ok(n)
    }

    /// The node and remote address of `len` bytes at `offset` of `ptr`, bounds checked.
    fn target(&self, ptr: RemotePtr, offset: u64, len: u64) -> Result<(Arc<Node>, RemoteAddr)> {
        if offset.checked_add(len).is_none_or(|end| end > ptr.len) {
            return Err(Error::OutOfBounds {
                offset,
                len,
                limit: ptr.len,
            });
        }
        let node = self.node(ptr.node)?;
        let l = node.desc.layout;
        let end = ptr.offset.checked_add(ptr.len);
        if ptr.offset < l.data_offset || end.is_none_or(|e| e > l.len) {
            return Err(Error::NotAllocated(format!(
                "{ptr:?} is outside node {}'s pool",
                ptr.node
            )));
        }
        let remote = node.remote(ptr.offset + offset);
        Ok((node, remote))
    }

    async fn alloc(&self, size: u64, key: Option<u64>) -> Result<RemotePtr> {
        let nodes = self.live_nodes();
        let chunk_size = nodes.first().map(|n| n.desc.layout.chunk_size);
        let loads = self.loads();
        let order = self.placement.lock().order(&loads, key);
        for id in order {
            let Some(node) = nodes.iter().find(|n| n.desc.node == id) else {
                continue;
            };
            if node.draining.load(Ordering::Relaxed) {
                continue;
            }
            let Some(class) = size_class(size, node.desc.layout.chunk_size) else {
                return Err(Error::InvalidArgument(format!(
                    "{size} bytes: larger than a chunk ({} bytes)",
                    node.desc.layout.chunk_size
                )));
            };
            match self.alloc_on(node, class, size).await {
                Ok(Some(p)) => return Ok(p),
                Ok(None) => continue, // full
                Err(Error::NodeDown { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        if chunk_size.is_none() {
            return Err(Error::NodeDown {
                node: 0,
                reason: "no memory server is reachable".into(),
            });
        }
        Err(Error::RemoteExhausted { size })
    }

    /// Allocates in a chunk of `class` on `node`, claiming a new chunk when those it has are
    /// full. `None`: the node has no room.
    async fn alloc_on(&self, node: &Node, class: u64, size: u64) -> Result<Option<RemotePtr>> {
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
            if !self.claim_chunk(node, class).await? {
                return Ok(None);
            }
        }
    }

    /// Sets a free bit of an owned chunk of `class`, locally then remotely.
    async fn alloc_in_owned(
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
    async fn claim_chunk(&self, node: &Node, class: u64) -> Result<bool> {
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
    async fn init_chunk(&self, node: &Node, index: u64, shape: ChunkShape) -> Result<()> {
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

    async fn free(&self, ptr: RemotePtr) -> Result<()> {
        let (node, _) = self.target(ptr, 0, 0)?;
        let l = node.desc.layout;
        let bad = |why: &str| Error::NotAllocated(format!("{ptr:?}: {why}"));
        let index = l
            .chunk_of(ptr.offset)
            .ok_or_else(|| bad("not in a chunk"))?;
        let chunk = l.chunk(index);
        let known = node
            .chunks
            .lock()
            .iter()
            .find(|c| c.index == index)
            .map(|c| c.shape);
        let shape = match known {
            Some(s) => s,
            None => {
                if self.read_u64(&node, chunk + layout::chunk::MAGIC).await? != layout::CHUNK_MAGIC
                {
                    return Err(bad("its chunk holds no objects"));
                }
                let size = self
                    .read_u64(&node, chunk + layout::chunk::OBJECT_SIZE)
                    .await?;
                if size == 0 || size > l.chunk_size {
                    return Err(bad("its chunk header is damaged"));
                }
                ChunkShape::new(l.chunk_size, size)
            }
        };
        let obj = shape
            .object_at(ptr.offset - chunk)
            .ok_or_else(|| bad("not the start of an object"))?;
        if ptr.len > shape.object_size {
            return Err(bad("longer than its object"));
        }
        let word_at = chunk + layout::chunk::BITMAP + (obj / 64) * 8;
        let bit = 1u64 << (obj % 64);
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
    async fn release_chunk(&self, node: &Node, index: u64) -> Result<()> {
        {
            let mut chunks = node.chunks.lock();
            match chunks.iter().position(|c| c.index == index && c.is_empty()) {
                Some(p) => {
                    chunks.swap_remove(p);
                }
                None => return Ok(()), // something was allocated in it meanwhile
            }
        }
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

    /// Renews the lease on every node four times per lease, and notices draining servers
    /// and lost leases.
    fn lease_loop(&self) {
        while !self.stop.load(Ordering::Acquire) {
            let nodes: Vec<Arc<Node>> = self.nodes.lock().values().cloned().collect();
            let mut tick = Duration::from_secs(1);
            for node in nodes {
                tick = tick.min(node.desc.lease / 4);
                if node.down.lock().is_some() {
                    continue;
                }
                let renewed = self.engine.run_until(async {
                    self.faa(&node, node.remote(node.slot.load(Ordering::Acquire) + 8), 1)
                        .await?;
                    self.read_u64(&node, layout::header::STATE).await
                });
                match renewed {
                    Ok(state) => {
                        *node.last_renewal.lock() = Instant::now();
                        node.draining
                            .store(state == STATE_DRAINING, Ordering::Relaxed);
                    }
                    Err(e) => {
                        // Past three quarters of a lease without renewal the server may
                        // hand our chunks to others: stop using them.
                        if node.last_renewal.lock().elapsed() > node.desc.lease * 3 / 4 {
                            node.mark_down(format!("lease renewal failed: {e}"));
                        }
                    }
                }
            }
            // Wake the tasks whose operations are past their deadline (they then give up).
            let now = Instant::now();
            self.timers.lock().retain(|(at, waker)| {
                let due = *at <= now;
                if due {
                    waker.wake_by_ref();
                }
                !due
            });
            let until = Instant::now()
                + tick
                    .max(Duration::from_millis(2))
                    .min(Duration::from_millis(250));
            while Instant::now() < until && !self.stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}
